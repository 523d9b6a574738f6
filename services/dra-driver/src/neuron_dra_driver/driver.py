"""Preparing and unpreparing claims: the API server's word on each claim, the health verdicts,
the CDI specs and the checkpoint, in that order.

Calls are serialised (one lock): the checkpoint is rewritten after each, and two calls for the
same claim must not interleave. During a rolling update two instances serve the kubelet at once (it
may prepare a claim through one and unprepare it through the other): with `lock_file` each call also
holds that file's lock and starts from the checkpoint on disk, which is the instances' shared state.
Both operations are idempotent, as the kubelet requires: a claim prepared before answers with the
same devices, without asking the API server again; unpreparing a claim not prepared (or already
unprepared, or whose object is gone) succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from neuron_common.kube import ApiError, ObjectReader
from neuron_dra_driver import checkpoint
from neuron_dra_driver.checkpoint import Checkpoint
from neuron_dra_driver.claims import (
    ClaimRef,
    ClaimRefused,
    CoresHeld,
    PreparedClaim,
    held_cores,
    prepare,
    share_cores,
    spec_file_name,
)
from neuron_dra_driver.metrics import DriverMetrics
from neuron_dra_driver.slices import Taint
from neuron_driver import cdi
from neuron_driver.inventory import NodeInventory
from neuron_model.ultraserver import UltraServerReading

log = logging.getLogger(__name__)


def _log(level: int, claim: ClaimRef, message: str, *args: object) -> None:
    """A line about one claim: named as its user knows it, with its UID to search the logs by."""
    log.log(level, f"claim %s/%s: {message}", claim.namespace, claim.name, *args, extra={"claim_uid": claim.uid})


def claim_path(namespace: str, name: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


class Driver:
    def __init__(
        self,
        *,
        node_name: str,
        api: ObjectReader,
        inventory: Callable[[], NodeInventory],
        unhealthy: Callable[[], Mapping[int, str]],
        checkpoint_file: Path,
        taints: Callable[[], Mapping[int, Taint]] = dict,
        ultraserver: Callable[[], UltraServerReading] | None = None,
        cdi_dir: Path,
        host_dev_root: Path,
        metrics: DriverMetrics,
        lock_file: Path | None = None,
    ) -> None:
        self.node_name = node_name
        self.api = api
        self.inventory = inventory
        self.unhealthy = unhealthy
        self.taints = taints
        # read at each prepare: the identity is pending until the driver's election ends
        self.ultraserver = ultraserver or (lambda: self.inventory().ultraserver)
        self.checkpoint = Checkpoint(checkpoint_file)
        self.cdi_dir = cdi_dir
        self.host_dev_root = host_dev_root
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self.lock_file = lock_file  # shared with the other instance of a rolling update; None: alone
        self.prepared: dict[str, PreparedClaim] = {}
        self.problem = ""  # a checkpoint recovery to report on /readyz's detail

    def _open_lock(self) -> int:
        assert self.lock_file is not None
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)  # the first start on a node
        return os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)  # closing it releases the lock

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        if self.lock_file is None:
            yield
            return
        fd = self._open_lock()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.asynccontextmanager
    async def _serialised(self) -> AsyncIterator[None]:
        """This instance's calls one at a time and, beside another instance, theirs too: the other
        may have prepared or unprepared claims since, so the claims are read again from the checkpoint."""
        async with self.lock:
            if self.lock_file is None:
                yield
                return
            fd = self._open_lock()
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)  # the other's call is short
                self._read_checkpoint()
                yield
            finally:
                os.close(fd)

    def _read_checkpoint(self) -> None:
        self.prepared, problem = self.checkpoint.recover(self.cdi_dir)
        if problem:
            self.problem = problem
            self.metrics.errors.labels("checkpoint").inc()

    def load(self) -> None:
        """The checkpoint's claims, each with its CDI spec on disk again if a reboot took it: the
        kubelet may start a container naming a claim's CDI device before asking the driver anything."""
        with self._file_lock():
            self._load()

    def _load(self) -> None:
        self.prepared, self.problem = self.checkpoint.recover(self.cdi_dir)
        if self.problem:
            self.metrics.errors.labels("checkpoint").inc()
        for claim in list(self.prepared.values()):
            self._ensure_spec(claim)
        self.metrics.prepared_claims.set(len(self.prepared))
        if self.prepared:
            log.info("%d prepared claim(s) from the checkpoint", len(self.prepared))

    def _spec_path(self, uid: str) -> Path:
        return self.cdi_dir / spec_file_name(uid)

    def _write_spec(self, claim: PreparedClaim) -> None:
        """The claim's CDI spec, annotated so that a spec alone says which claim it serves."""
        cdi.write_spec(self.cdi_dir, spec_file_name(claim.uid), checkpoint.annotate(dict(claim.spec), claim))

    def _ensure_spec(self, claim: PreparedClaim) -> bool:
        """True when `claim`'s CDI spec is on disk (written again from the checkpoint if it was
        missing); False when it is missing and the checkpoint has no copy (a checkpoint written by
        an older driver): such a claim is prepared again from the API server when the kubelet asks."""
        if self._spec_path(claim.uid).exists():
            return True
        if not claim.spec:
            _log(
                logging.WARNING,
                claim,
                "its CDI spec is gone and the checkpoint has no copy; it is prepared again when asked",
            )
            return False
        try:
            self._write_spec(claim)
        except OSError as exc:
            self.metrics.errors.labels("write").inc()
            _log(logging.ERROR, claim, "cannot write its CDI spec again: %s", exc)
            return False
        self.metrics.cdi_specs_restored.inc()
        _log(logging.INFO, claim, "CDI spec written again from the checkpoint (gone, as after a reboot)")
        return True

    async def prepare(self, refs: Iterable[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Per claim UID: the prepared claim, or why it was refused."""
        results: dict[str, PreparedClaim | str] = {}
        async with self._serialised():
            for ref in refs:
                started = time.perf_counter()
                results[ref.uid] = await self._prepare_one(ref)
                self.metrics.prepare_duration.labels("prepare").observe(time.perf_counter() - started)
            self.metrics.prepared_claims.set(len(self.prepared))
        return results

    def _prepare_from(self, claim: dict[str, Any], ref: ClaimRef, known: PreparedClaim | None) -> PreparedClaim:
        inventory = self.inventory()
        others = [c for uid, c in self.prepared.items() if uid != ref.uid]
        return prepare(
            claim,
            ref.uid,
            self.node_name,
            inventory,
            self.unhealthy(),
            self.host_dev_root,
            self.taints(),
            self.ultraserver(),
            held=held_cores(others, inventory),
            shared=share_cores(others),
            kept={d.share_key(): d.cores for d in known.devices if d.cores} if known else None,
        )

    async def _forget_stale(self, asking: str) -> bool:
        """Take out of the checkpoint every other prepared claim whose ResourceClaim is gone, was
        recreated (another UID) or is no longer allocated to this node: an entry the kubelet never
        unprepared (its own state lost, say) would otherwise hold its cores against every later claim.
        True when any was taken out. A claim the API server cannot be asked about now is kept."""
        stale: list[PreparedClaim] = []
        for uid, held in list(self.prepared.items()):
            if uid == asking:
                continue
            try:
                current = await self.api.get(claim_path(held.namespace, held.name))
            except ApiError as exc:
                if exc.status == 404:
                    stale.append(held)
                continue
            allocation = (current.get("status") or {}).get("allocation") or {}
            pools = {r.get("pool") for r in (allocation.get("devices") or {}).get("results") or []}
            if (current.get("metadata") or {}).get("uid") != uid or self.node_name not in pools:
                stale.append(held)
        if not stale:
            return False
        for held in stale:
            self.prepared.pop(held.uid, None)
        try:
            self.checkpoint.save(self.prepared)
        except OSError as exc:
            for held in stale:
                self.prepared[held.uid] = held
            self.metrics.errors.labels("write").inc()
            _log(logging.ERROR, stale[0], "cannot take stale claims out of the checkpoint: %s", exc)
            return False
        for held in stale:
            cdi.remove_spec(self.cdi_dir, spec_file_name(held.uid))
            self.metrics.stale_claims_forgotten.inc()
            _log(logging.WARNING, held, "forgotten: its ResourceClaim is gone or no longer allocated here")
        return True

    async def _prepare_one(self, ref: ClaimRef) -> PreparedClaim | str:
        known = self.prepared.get(ref.uid)
        if known is not None and self._ensure_spec(known):
            return known
        # not prepared, or prepared but its spec is gone with no copy: ask the API server
        try:
            claim = await self.api.get(claim_path(ref.namespace, ref.name))
            try:
                prepared = self._prepare_from(claim, ref, known)
            except CoresHeld:
                if not await self._forget_stale(ref.uid):
                    raise
                prepared = self._prepare_from(claim, ref, known)
        except ClaimRefused as exc:
            self.metrics.refusals.labels("refused").inc()
            _log(logging.WARNING, ref, "refused: %s", exc)
            return f"claim {ref.namespace}/{ref.name}: {exc}"
        except Exception as exc:  # the API server's answer, or none: the kubelet retries
            self.metrics.refusals.labels("error").inc()
            _log(logging.WARNING, ref, "cannot prepare it: %s", exc)
            return f"claim {ref.namespace}/{ref.name}: {exc}"
        try:
            self._write_spec(prepared)
            self.prepared[ref.uid] = prepared
            self.checkpoint.save(self.prepared)
        except OSError as exc:
            if known is None:
                self.prepared.pop(ref.uid, None)
            else:  # still in the checkpoint on disk: kept, so an unprepare takes it out of there too
                self.prepared[ref.uid] = known
            cdi.remove_spec(self.cdi_dir, spec_file_name(ref.uid))
            self.metrics.errors.labels("write").inc()
            return f"claim {ref.namespace}/{ref.name}: cannot write its CDI spec or the checkpoint: {exc}"
        _log(logging.INFO, ref, "prepared: %s", ",".join(d.device for d in prepared.devices))
        return prepared

    async def unprepare(self, refs: Iterable[ClaimRef]) -> dict[str, str]:
        """Per claim UID: "" when unprepared (or never prepared), else the error."""
        results: dict[str, str] = {}
        async with self._serialised():
            for ref in refs:
                started = time.perf_counter()
                results[ref.uid] = self._unprepare_one(ref)
                self.metrics.prepare_duration.labels("unprepare").observe(time.perf_counter() - started)
            self.metrics.prepared_claims.set(len(self.prepared))
        return results

    def _unprepare_one(self, ref: ClaimRef) -> str:
        try:
            cdi.remove_spec(self.cdi_dir, spec_file_name(ref.uid))
            claim = self.prepared.pop(ref.uid, None)
            if claim is not None:
                try:
                    self.checkpoint.save(self.prepared)
                except OSError:
                    # the checkpoint on disk still has it: kept, the kubelet's retry saves again, or a
                    # restart would bring the claim back and write its CDI spec again
                    self.prepared[ref.uid] = claim
                    raise
                _log(logging.INFO, ref, "unprepared")
        except OSError as exc:
            self.metrics.errors.labels("write").inc()
            return f"claim {ref.namespace}/{ref.name}: {exc}"
        return ""
