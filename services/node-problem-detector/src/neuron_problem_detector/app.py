"""Wiring: rules, saved state, the kernel-log and counter sources, the reporter, metrics."""

from __future__ import annotations

import asyncio
import logging

from neuron_common import metrics_auth
from neuron_common.health_server import HealthServer
from neuron_common.kube import Api
from neuron_common.lifecycle import sleep_or_stop
from neuron_common.metrics import MetricSet, Series
from neuron_common.runner import run_service
from neuron_common.supervisor import Loop, Supervisor
from neuron_driver.inventory import scan_at_start
from neuron_driver.kmsg import KmsgRecord
from neuron_health import layout_check, verdicts
from neuron_health.kernel_log import host_timezone
from neuron_health.pipeline import CounterRead, CounterWatch, KernelLogSource
from neuron_model import node_health
from neuron_problem_detector import reset
from neuron_problem_detector import rules as rules_mod
from neuron_problem_detector.config import API_TIMEOUT, Config
from neuron_problem_detector.detector import ConditionStatus, Problem, load_state, save_state, wall_now
from neuron_problem_detector.reporter import Reporter
from neuron_problem_detector.resetter import DeviceResetter, run_validation_command
from neuron_problem_detector.revalidate import RebootValidator
from neuron_problem_detector.rules import Match, Rules

log = logging.getLogger(__name__)


def condition_reasons(rules: Rules, condition: str) -> list[str]:
    """The reasons a condition is set by: the rules' own, or for NeuronHealthSourcesMissing the layout check's."""
    if condition == node_health.SOURCES_MISSING_CONDITION:
        return [layout_check.REASON]
    return rules.reasons_of(condition)


class Metrics:
    def __init__(self, rules: Rules) -> None:
        # node-problem-detector's own names, so its dashboards and alerts work unchanged
        npd = MetricSet("")
        self.registry = npd.registry
        self.problem_counter = npd.counter("problem_counter", "Problems seen, by reason", ["reason"])
        self.problem_gauge = npd.gauge(
            "problem_gauge",
            "1 while a condition is set by this reason (at most one reason per type)",
            ["type", "reason"],
            shown=[
                (condition, reason)
                for condition in [*(c.type for c in rules.conditions), node_health.SOURCES_MISSING_CONDITION]
                for reason in condition_reasons(rules, condition)
            ],
        )
        m = MetricSet("neuron_npd", self.registry)
        self.kmsg_records = m.counter("kmsg_records", "Kernel log records read")
        self.kmsg_malformed = m.counter("kmsg_malformed", "Kernel log records that could not be parsed")
        self.api_up = m.gauge("api_up", "1 when the last API server call succeeded")
        self.pending_events = m.gauge("pending_events", "Events waiting for the API server")
        self.failed_events = m.gauge("failed_events", "Events dropped after the API server refused them repeatedly")
        self.dropped_events = m.gauge("dropped_events", "Events dropped while the API server was away")
        self.active_problems = m.gauge("active_problems", "Problems currently setting a condition")
        self.read_errors = m.counter(
            "read_errors", "Failed reads of a health source, by source (counters, kernel_log)", ["source"]
        )
        self.health_sources_missing = layout_check.declare_gauge(m)
        self.device_reset_steps = m.counter(
            "device_reset_steps",
            "Steps of the device reset and its validation, by step (wait, reset, validate, check, pass, escalate)",
            ["step"],
            shown=[(step,) for step in reset.STEPS],
        )
        self._sets = (npd, m)

    def series(self) -> tuple[Series, ...]:
        return tuple(s for metric_set in self._sets for s in metric_set.series())


def catalogue() -> tuple[Series, ...]:
    """Every series the detector serves on /metrics (with --metrics-auth=kubernetes, the authorizer's too)."""
    return (*Metrics(rules_mod.default_rules()).series(), *metrics_auth.catalogue())


class Detector:
    def __init__(self, config: Config, stop: asyncio.Event, api: Api | None = None) -> None:
        """`api`: the API-server client for the conditions, Events, remediation and /metrics reviews;
        by default made from --kubeconfig or the pod's service account."""
        self.config = config
        self.stop = stop
        self.rules = rules_mod.load(config.rules)
        self.metrics = Metrics(self.rules)
        self.state, warning = load_state(config.state_file)
        self.saves = 0  # state-file writes: a change that already saved does not save again
        self.validated: ConditionStatus | None = None  # the verdict on this boot, once given (--validate-after-reboot)
        if warning:
            log.warning(warning)
        boot = verdicts.boot_id(config.host_root)
        if self.state.new_boot(boot):
            log.info("first start on this boot: no problem carried over", extra={"boot_id": boot})
            if config.verdict_dir is not None:
                verdicts.clear_all(config.verdict_dir)
        elif self.state.problems:
            log.warning(
                "restarted on the same boot: keeping %d problem(s)", len(self.state.problems),
                extra={"problems": ", ".join(sorted(self.state.problems))},
            )  # fmt: skip
        if self.state.seq_source != config.kernel_log_format:
            # the other format numbers its records otherwise: its last number says nothing here
            self.state.seq_source, self.state.last_seq = config.kernel_log_format, -1
        self.kube = api if api is not None else Api.from_kubeconfig(config.kubeconfig, API_TIMEOUT)
        self.reporter = Reporter(self.kube, config.node_name, self.rules.source, config)
        inventory = scan_at_start(config.host_root, log)
        self.inventory = inventory  # as the counter watch last found it
        # A counter the stack cannot find is never read: said on the node, not only in a log, as an Event and
        # as the condition NeuronHealthSourcesMissing, which stays True for as long as it is missing (checked
        # again on each new inventory, and at each counter read while something is missing).
        self.layout = layout_check.check_at_start(config.host_root, inventory, log, self.metrics.health_sources_missing)
        if not self.layout.ok:
            self.reporter.event(layout_check.REASON, self.layout.summary()[:1024])
        self._publish()
        self.supervisor = Supervisor(stop)
        self.http = HealthServer.for_service(
            config.listen, self.metrics.registry, self.supervisor, self.ready, config.metrics_security, api=self.kube
        )
        count = self.metrics.read_errors.labels
        # /dev/kmsg wakes the follower itself; a kernel-log *file* (a simulated node, syslog) is polled
        self.kernel_log = KernelLogSource(
            config.kmsg_path,
            format=config.kernel_log_format,
            tz=host_timezone(config.host_root),
            lookback=config.lookback,
            file_poll=0.25,
            retry=10,
            on_error=lambda source: count(source).inc(),
        )
        # the device counters, and only those per-core statuses a rule names (a trn2 has 1,024 cores' worth)
        core_counters = {r.counter for r in self.rules.counter_rules if r.counter and r.core_counter}
        # always: a stalled heartbeat is validated in place whether or not the device reset is on
        self.resetter = DeviceResetter(
            config,
            inventory,
            state=lambda: self.state,
            event=lambda reason, message, warning: self.reporter.event(reason, message, warning=warning),
            cleared=self.cleared,
            changed=self._publish,
            totals=lambda: self.counters.last,
            step_metric=lambda step: self.metrics.device_reset_steps.labels(step).inc(),
        )
        self.validator: RebootValidator | None = None
        if config.validate_after_reboot:
            self.validator = RebootValidator(
                self.kube,
                config.node_name,
                window=config.validation_window,
                command=config.validation_command,
                command_timeout=config.validation_timeout,
                devices=[d.index for d in inventory.devices],
                problems=lambda: [p.reason for p in self.state.problems.values()],
                totals=lambda: self.counters.last,
                verdict=self._validated,
                event=lambda reason, message, warning: self.reporter.event(reason, message, warning=warning),
                run_command=lambda command, limit: run_validation_command(command, limit, {}),
            )
        self.counters = CounterWatch(
            config.host_root,
            config.counter_interval,
            core_counters,
            on_error=lambda source: count(source).inc(),
            previous=self.state.counters,
            inventory=inventory,
            heartbeat_stale_after=config.heartbeat_stale_after,
        )

    # -- health ------------------------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        api = "reachable" if self.reporter.api_up else "unreachable (state is kept and delivered when it returns)"
        kmsg = "following" if self._kmsg_ok else "not readable"
        layout = "" if self.layout.ok else f"; health counters unreadable: {len(self.layout.missing)} path(s)"
        return True, f"kernel log {kmsg}; API server {api}; {len(self.state.problems)} active problem(s){layout}"

    # -- changes -------------------------------------------------------------------------------------
    def handle(self, matches: list[Match]) -> None:
        changed = False
        for m in matches:
            self.metrics.problem_counter.labels(m.rule.reason).inc()
            self.resetter.seen(m.device, m.rule.reason, wall_now())
            where = f"neuron{m.device}" if m.device is not None else "Neuron"
            extra = "".join(f" {k}={v}" for k, v in (("nc-id", m.core), ("serial", m.serial)) if v is not None)
            self.reporter.event(m.rule.reason, f"{where}{extra}: {m.detail}"[:1024])
            problem = self.state.add(m, wall_now())
            if problem is not None:
                changed = True
                log.warning(
                    "%s",
                    problem.message,
                    extra={"reason": problem.reason, "device": problem.device, "condition": problem.condition},
                )
        if changed:
            self._publish()
        else:  # an Event only: saved all the same, so a crash does not send it again on the replay
            self._save()

    def cleared(self, gone: list[Problem], why: str) -> None:
        if not gone:
            return
        for p in gone:
            log.info("%s cleared: %s", p.message, why, extra={"reason": p.reason, "device": p.device})
            self.reporter.event(f"{p.reason}Cleared", f"{p.message} cleared: {why}", warning=False)
        self._publish()

    def _validated(self, condition: ConditionStatus) -> None:
        self.validated = condition
        self._publish()

    def _save(self) -> None:
        self.saves += 1
        try:
            save_state(self.config.state_file, self.state)
        except OSError as exc:
            log.error("cannot save state to %s: %s", self.config.state_file, exc)

    def _publish(self) -> None:
        """Push the state everywhere it shows: file, conditions, verdicts, metrics."""
        self._save()
        failed = self.validated.message if self.validated is not None and self.validated.unhealthy else None
        conditions = self.state.conditions(
            self.rules,
            wall_now(),
            accelerated_hardware=self.config.accelerated_hardware_condition != "off",
            validation_failed=failed,
            sources_missing=self.layout.summary(),
        )
        if self.validated is not None:
            conditions = [*conditions, self.validated]
        self.reporter.set_conditions(conditions)
        for c in conditions:
            for reason in condition_reasons(self.rules, c.type):
                self.metrics.problem_gauge.labels(c.type, reason).set(
                    1 if c.status == "True" and c.reason == reason else 0
                )
        self.metrics.active_problems.set(len(self.state.problems))
        if self.config.verdict_dir is not None:
            unhealthy = self.state.unhealthy_devices()
            try:
                for device, problem in unhealthy.items():
                    verdicts.write_verdict(
                        self.config.verdict_dir,
                        device,
                        problem.reason,
                        problem.message,
                        self.state.boot_id,
                        # every verdict is written again on any change: it keeps its problem's time
                        since=problem.since,
                    )
                for device in set(verdicts.read_verdicts(self.config.verdict_dir, self.config.host_root)) - set(
                    unhealthy
                ):
                    verdicts.clear_verdict(self.config.verdict_dir, device)
            except OSError as exc:
                log.error("cannot write device verdicts to %s: %s", self.config.verdict_dir, exc)

    # -- sources: the health pipeline's counter watch and kernel-log source -------------------------
    def kernel_record(self, record: KmsgRecord) -> None:
        """A kernel-log record, from the loop `kmsg` (the pipeline's `KernelLogSource`)."""
        self.metrics.kmsg_records.inc()
        if record.seq <= self.state.last_seq:
            return  # handled before a restart on this boot
        self.state.last_seq = record.seq
        matches = rules_mod.match_message(self.rules, record.message)
        if matches:
            self.handle(matches)

    @property
    def _kmsg_ok(self) -> bool:
        return self.kernel_log.following

    def check_counters(self) -> None:
        """One read of the driver's counters and its handling, at once (tests; the loop reads on its interval)."""
        self.counters_read(self.counters.read())

    def counters_read(self, read: CounterRead) -> None:
        """A read of the driver's counters, from the loop `counters` (the pipeline's `CounterWatch`):
        problems that appeared, and those a reload mended."""
        if read.inventory is not None:
            self.inventory = read.inventory
        if read.inventory is not None or not self.layout.ok:
            self.recheck_layout()
        saved, saves = self.state.counters, self.saves
        last = self.counters.last
        self.state.counters = dict(last) if last is not None else None
        if read.reloaded:
            self.cleared(
                self.state.clear_devices(set(read.reloaded)), "the driver's counters were reset (driver reloaded)"
            )
        matches = rules_mod.match_counters(self.rules, read.previous, read.totals)
        if matches:
            self.handle(matches)
        self.cleared(self.state.expire(wall_now()), "clearAfter passed")
        if self.state.counters != saved and self.saves == saves:
            self._save()  # a restart must not take what it has seen for news

    def recheck_layout(self) -> None:
        """The layout check again (a new inventory: the driver was reloaded, perhaps into another layout; or a
        path is missing): a change is logged, an Event, and the condition NeuronHealthSourcesMissing."""
        report = layout_check.recheck(
            self.config.host_root, self.inventory, self.layout, log, self.metrics.health_sources_missing
        )
        if report is None:
            return
        before, self.layout = self.layout, report
        if report.ok:
            version = report.driver_version or "of unknown version"
            message = f"every health counter the stack reads is there again (driver {version}); was: {before.summary()}"
            self.reporter.event(f"{layout_check.REASON}Cleared", message[:1024], warning=False)
        else:
            self.reporter.event(layout_check.REASON, report.summary()[:1024])
        self._publish()

    async def report_metrics(self) -> None:
        while not self.stop.is_set():
            self.metrics.api_up.set(1 if self.reporter.api_up else 0)
            self.metrics.pending_events.set(len(self.reporter.pending))
            self.metrics.dropped_events.set(self.reporter.dropped_events)
            self.metrics.failed_events.set(self.reporter.failed_events)
            await sleep_or_stop(self.stop, 5)

    async def run(self) -> int:
        log.info(
            "watching %s and the driver's counters for node %s", self.config.kmsg_path, self.config.node_name,
            extra={"rules": str(self.config.rules or "built-in"),
                   "conditions": ",".join(c.type for c in self.rules.conditions)},
        )  # fmt: skip
        loops: dict[str, Loop] = {
            "kmsg": lambda: self.kernel_log.run(
                self.stop, self.kernel_record, on_malformed=lambda _: self.metrics.kmsg_malformed.inc()
            ),
            "counters": lambda: self.counters.run(self.stop, self.counters_read),
            "reporter": lambda: self.reporter.run(self.stop),
            "metrics": self.report_metrics,
        }
        loops["device-reset"] = lambda: self.resetter.run(self.stop)
        if self.validator is not None:
            validator = self.validator
            loops["validate-after-reboot"] = lambda: validator.run(self.stop)
        return await run_service(self.http, self.supervisor, self.stop, lambda: loops, release=self._release)

    async def _release(self) -> None:
        log.info("saving state")
        save_state(self.config.state_file, self.state)
        await self.kube.close()
