"""Generates charts/neuron-helm-chart/values.schema.json; nobody writes it by hand.

    chart_schema.py            write values.schema.json
    chart_schema.py --check    exit 1 when it is stale, or when values.yaml disagrees with a flag

Sources, each fact in one place:
- the services' flag declarations (`neuron_common.config.flag`): a value annotated `# @flag PROG --FLAG`
  takes its type, enum (the flag's choices) and bounds (its validator) from that flag, and its default in
  values.yaml is checked against the flag's declared default;
- values.yaml: a value's YAML type gives its JSON type; a mapping is an object of exactly its keys, all
  required; a list of strings is an array of strings; `# --` is the description, which every value has
  (on itself or on a mapping above it; helm-docs renders them as the README's table). What cannot be told
  from that is a `# @schema {json}` line, merged over what is inferred (the convention is described at
  the top of values.yaml);
- templates/_aws.tpl: the keys of AWS's chart that are admitted only to be refused with their equivalent.

Annotation lines go above a value's `# --` line: helm-docs reads a description from the last `# --`
line to the key and appends every comment line in between, so nothing but the description may follow it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "neuron-helm-chart"
SCHEMA_PATH = CHART / "values.schema.json"
AWS_ONLY = (
    "a key of AWS's neuron-helm-chart, admitted only to be refused with this chart's equivalent (templates/_aws.tpl)"
)
ANNOTATION = re.compile(r"^\s*# @(?P<kind>schema\.def|schema|flag)\s+(?P<body>.+?)\s*$")
FLAG_REF = re.compile(r"^(?P<prog>[a-z][a-z-]*)\s+(?P<flag>--[a-z][a-z0-9-]*)(?:\s+(?P<options>\{.*\}))?$")
DESCRIPTION = re.compile(r"^\s*# --\s?(?P<text>.*)$")
# a Go/Kubernetes duration as the chart writes one (whole numbers of ms, s, m, h), and one that is not zero
DURATION = "^([0-9]+(ms|s|m|h))+$"
POSITIVE_DURATION = "^([0-9]+(ms|s|m|h))*[0-9]*[1-9][0-9]*(ms|s|m|h)([0-9]+(ms|s|m|h))*$"
# bounds an annotation may only narrow: the service would refuse what the flag's declaration refuses
LOWER_BOUNDS = ("minimum", "exclusiveMinimum")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum")


class ChartSchemaError(Exception):
    """values.yaml's annotations contradict themselves or a flag's declaration."""


@dataclass(frozen=True)
class FlagRef:
    """`# @flag PROG --FLAG {options}`: the chart renders this value into that flag.

        options: "map" (chart value as JSON text -> the flag's word, e.g. {"0": "off"}), "format" (the word
        is this with `{}` replaced by the value, e.g. "0.0.0.0:{}"), "chartDefault" (why the chart's default
        differs from the flag's, which is otherwise an error), "auto" (a switch whose chart default is "auto":
    the named helper resolves it to true or false)."""

    prog: str
    flag: str
    options: dict[str, Any]

    def word(self, value: Any) -> str:
        mapped = self.options.get("map", {})
        key = json.dumps(value)
        if key in mapped:
            return str(mapped[key])
        if "format" in self.options:
            return str(self.options["format"]).format(value)
        # the services' list flags are comma-separated words, their maps `key=value` pairs
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        if isinstance(value, dict):
            return ",".join(f"{k}={v}" for k, v in value.items())
        return key if isinstance(value, bool) else str(value)

    def value(self, word: str, like: Any) -> Any:
        """The chart value that renders as `word`, of the type of `like` (the chart's default)."""
        for key, mapped in self.options.get("map", {}).items():
            if mapped == word:
                return json.loads(key)
        if isinstance(like, (bool, int, float)):
            return json.loads(word)
        return word

    def __str__(self) -> str:
        return f"{self.prog} {self.flag}"


@dataclass
class Annotations:
    schema: dict[str, Any] = field(default_factory=dict)
    defs: dict[str, Any] = field(default_factory=dict)
    flags: list[FlagRef] = field(default_factory=list)
    description: str = ""


def parse_annotations(lines: list[str], where: str) -> Annotations:
    found = Annotations()
    described: list[str] | None = None
    for line in lines:
        if (match := DESCRIPTION.match(line)) is not None:
            described = [match["text"].strip()]
            continue
        if described is not None:
            # helm-docs appends these to the description
            described.append(line.strip().removeprefix("#").strip())
            continue
        match = ANNOTATION.match(line)
        if match is None:
            continue
        kind, body = match["kind"], match["body"]
        try:
            if kind == "flag":
                ref = FLAG_REF.match(body)
                if ref is None:
                    raise ChartSchemaError(f"{where}: `# @flag {body}` is not `# @flag PROG --FLAG [{{options}}]`")
                found.flags.append(FlagRef(ref["prog"], ref["flag"], json.loads(ref["options"] or "{}")))
            elif kind == "schema":
                found.schema = {**found.schema, **json.loads(body)}
            else:
                name, _, definition = body.partition(" ")
                found.defs[name] = json.loads(definition)
        except json.JSONDecodeError as exc:
            raise ChartSchemaError(f"{where}: `# @{kind}` is not followed by JSON: {exc}") from None
    if described is not None:
        found.description = " ".join(t for t in described if t)
    return found


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on `base`: keys replace, except `properties`, merged key by key; a null removes a key."""
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif key == "properties" and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def comment_blocks(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The file's header (its first comment lines) and, for each key's dotted path, the comment lines
    right above it."""
    lines = text.splitlines()
    header: list[str] = []
    for line in lines:
        if not line.lstrip().startswith("#"):
            break
        header.append(line)
    blocks: dict[str, list[str]] = {}

    def walk(node: yaml.Node, path: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            dotted = f"{path}.{key.value}" if path else str(key.value)
            above = key.start_mark.line - 1
            start = above
            while start >= 0 and lines[start].lstrip().startswith("#"):
                start -= 1
            if start < len(header) - 1 < above and not path:
                start = len(header) - 1  # the header belongs to the file, not to the first key
            blocks[dotted] = lines[start + 1 : above + 1]
            walk(value, dotted)

    root = yaml.compose(text)
    if root is not None:
        walk(root, "")
    return header, blocks


def service_flags() -> dict[str, dict[str, Any]]:
    """Every service's flags, by program and flag name, as declared (with the service's FLAGS applied):
    the `Config` of each services/*/src/<package>/config.py."""
    from neuron_common.config import ServiceConfig, _flag_name, _flags

    flags: dict[str, dict[str, Any]] = {}
    for path in sorted(REPO.glob("services/*/src/*/config.py")):
        config = importlib.import_module(f"{path.parent.name}.config").Config
        if not issubclass(config, ServiceConfig):
            raise ChartSchemaError(f"{path}: its Config is no ServiceConfig")
        flags[config.PROG] = {_flag_name(name, spec): spec for name, spec in _flags(config)}
    return flags


def validator_schemas() -> dict[Callable[[str], Any], dict[str, dict[str, Any]]]:
    """What each validator of the flags admits, by the JSON type of the chart's value."""
    from neuron_common.config import (
        LOG_LEVELS,
        listen_address,
        log_level,
        non_negative_duration,
        positive_duration,
        positive_int,
    )
    from neuron_remediation.config import percent

    return {
        positive_duration: {
            "number": {"type": "number", "exclusiveMinimum": 0},
            "string": {"type": "string", "pattern": POSITIVE_DURATION},
        },
        non_negative_duration: {
            "number": {"type": "number", "minimum": 0},
            "string": {"type": "string", "pattern": DURATION},
        },
        positive_int: {"integer": {"type": "integer", "minimum": 1}},
        percent: {"number": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}},
        log_level: {"string": {"type": "string", "enum": list(LOG_LEVELS)}},
        # the port of host:port; 0 picks a free one
        listen_address: {"integer": {"type": "integer", "minimum": 0, "maximum": 65535}},
    }


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise ChartSchemaError(f"no JSON type for {value!r}")


def flag_schema(ref: FlagRef, spec: Any, default: Any, where: str) -> dict[str, Any]:
    """The schema the flag's declaration gives the chart value, after checking the value's default
    against the flag's."""
    kind = json_type(default)
    if spec.switch and default == "auto" and "auto" in ref.options:
        # the chart resolves "auto" (the helper the option names) and renders the switch either way
        agrees = False
        schema: dict[str, Any] = {"enum": ["auto", True, False]}
    elif spec.switch:
        if kind != "boolean":
            raise ChartSchemaError(f"{where}: {ref} is a switch, but the default {default!r} is not a boolean")
        agrees = default == spec.default
        schema = {"type": "boolean"}
    elif spec.choices is not None:
        words = [str(c) for c in spec.choices]
        if ref.word(default) not in words:
            raise ChartSchemaError(
                f"{where}: the default {default!r} renders {ref} {ref.word(default)!r}, not one of {words}"
            )
        agrees = ref.word(default) == str(spec.default)
        values = [ref.value(w, default) for w in words]
        schema = {"type": kind}
        if kind != "boolean":
            schema["enum"] = values
        elif sorted(values) != [False, True]:
            raise ChartSchemaError(f"{where}: {ref}'s choices {words} are not one per boolean")
    else:
        by_type = validator_schemas().get(spec.type, {})
        if kind == "integer" and "integer" not in by_type and "number" in by_type:
            kind = "number"  # whole seconds written without a fraction
        if by_type and kind not in by_type:
            raise ChartSchemaError(f"{where}: {ref} takes a {' or '.join(by_type)}, the default is {default!r}")
        schema = dict(by_type.get(kind, {"type": kind}))
        try:
            given = spec.type(ref.word(default))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise ChartSchemaError(f"{where}: {ref} refuses the default {ref.word(default)!r}: {exc}") from None
        declared = spec.type(spec.default) if isinstance(spec.default, str) else spec.default
        agrees = given == declared
    if agrees and "chartDefault" in ref.options:
        raise ChartSchemaError(f"{where}: says its default is the chart's own, but it is {ref}'s ({spec.default!r})")
    if not agrees and "chartDefault" not in ref.options:
        raise ChartSchemaError(
            f"{where}: the default {default!r} is not {ref}'s {spec.default!r}; make them one, or say why the chart's "
            'differs with {"chartDefault": "..."}'
        )
    return schema


def check_narrows(derived: dict[str, Any], annotated: dict[str, Any], where: str) -> None:
    """An annotation may narrow what a flag admits (the service refuses the rest), never widen it."""
    for key, value in annotated.items():
        if key not in derived or value == derived[key]:
            continue
        narrower = (
            (key in LOWER_BOUNDS and value >= derived[key])
            or (key in UPPER_BOUNDS and value <= derived[key])
            or (key == "enum" and all(v in derived[key] for v in value))
        )
        if not narrower:
            raise ChartSchemaError(
                f"{where}: `{key}: {json.dumps(value)}` widens the flag's {json.dumps(derived[key])}"
            )


@dataclass
class Generator:
    blocks: dict[str, list[str]]
    flags: dict[str, dict[str, Any]]
    defs: dict[str, Any] = field(default_factory=dict)

    def annotations(self, path: str) -> Annotations:
        found = parse_annotations(self.blocks.get(path, []), f"values.yaml {path}")
        if found.defs:
            raise ChartSchemaError(f"values.yaml {path}: `# @schema.def` belongs in the file's header")
        return found

    def node(self, path: str, value: Any) -> dict[str, Any]:
        found = self.annotations(path)
        if "$ref" in found.schema:
            schema = dict(found.schema)
        elif isinstance(value, dict) and "properties" in found.schema and found.schema["properties"] is None:
            # a free-form object: its keys in values.yaml are examples, not its shape
            schema = merge({"type": "object"}, found.schema)
        else:
            schema = merge(self.inferred(path, value, found), found.schema)
        if found.description:
            schema["description"] = found.description
        return schema

    def inferred(self, path: str, value: Any, found: Annotations) -> dict[str, Any]:
        where = f"values.yaml {path}"
        derived: list[dict[str, Any]] = []
        for ref in found.flags:
            spec = self.flags.get(ref.prog, {}).get(ref.flag)
            if spec is None:
                raise ChartSchemaError(f"{where}: {ref} is no flag of that program")
            derived.append(flag_schema(ref, spec, value, where))
        if derived:
            if any(d != derived[0] for d in derived):
                raise ChartSchemaError(f"{where}: its flags admit different values: {derived}")
            check_narrows(derived[0], found.schema, where)
            return derived[0]
        if isinstance(value, dict) and value:
            return {
                "type": "object",
                "properties": {k: self.node(f"{path}.{k}" if path else k, v) for k, v in value.items()},
                "additionalProperties": False,
                "required": list(value),
            }
        if value is None:
            return {}
        schema: dict[str, Any] = {"type": json_type(value)}
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            schema["items"] = {"type": "string"}
        return schema


def aws_keys(template: str) -> list[str]:
    """The dotted keys of AWS's chart that "neuron.awsRefusals" refuses with their equivalent."""
    body = template.split('define "neuron.awsRefusals"', 1)[1].split("{{- end -}}", 1)[0]
    return re.findall(r'^\s*"([A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)*)"\s', body, re.MULTILINE)


def tidy(schema: Any) -> Any:
    """An empty `required` says nothing; leave it out."""
    if isinstance(schema, dict):
        return {k: tidy(v) for k, v in schema.items() if not (k == "required" and v == [])}
    if isinstance(schema, list):
        return [tidy(v) for v in schema]
    return schema


def leaves(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [leaf for k, v in values.items() for leaf in leaves(v, f"{prefix}.{k}" if prefix else k)]
    return [prefix]


def undocumented(values: Any, blocks: dict[str, list[str]]) -> list[str]:
    """The values no `# --` comment covers (one on a mapping covers its children)."""
    documented = {path for path, lines in blocks.items() if any(DESCRIPTION.match(line) for line in lines)}
    return [leaf for leaf in leaves(values) if not any(leaf == k or leaf.startswith(f"{k}.") for k in documented)]


def generate(values_text: str, aws_template: str, flags: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    header, blocks = comment_blocks(values_text)
    root = parse_annotations(header, "values.yaml header")
    generator = Generator(blocks, service_flags() if flags is None else flags)
    values = yaml.safe_load(values_text)
    if missing := undocumented(values, blocks):
        raise ChartSchemaError(f"values without a `# --` comment: {', '.join(missing)}")
    body = merge(generator.inferred("", values, Annotations()), root.schema)
    for dotted in aws_keys(aws_template):
        *parents, last = dotted.split(".")
        node = body
        for part in parents:
            node = node["properties"][part]
        if last in node["properties"]:
            raise ChartSchemaError(f"{dotted}: refused as AWS's key by templates/_aws.tpl, yet a value of this chart")
        node["properties"][last] = {"description": AWS_ONLY}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "neuron-helm-chart values", **body}
    schema["$defs"] = root.defs
    tidied: dict[str, Any] = tidy(schema)
    return tidied


def render() -> str:
    values_text = (CHART / "values.yaml").read_text()
    aws_template = (CHART / "templates" / "_aws.tpl").read_text()
    return json.dumps(generate(values_text, aws_template), indent=2, ensure_ascii=False) + "\n"


def walk_flags(values_text: str) -> Iterator[tuple[str, FlagRef]]:
    """Every (dotted value, flag) pair values.yaml declares."""
    _, blocks = comment_blocks(values_text)
    for path, lines in blocks.items():
        for ref in parse_annotations(lines, path).flags:
            yield path, ref


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail instead of writing when the schema is stale")
    args = parser.parse_args()
    try:
        wanted = render()
    except ChartSchemaError as exc:
        print(f"values.yaml: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if SCHEMA_PATH.read_text() != wanted:
            print(f"{SCHEMA_PATH} is stale: run make chart-docs", file=sys.stderr)
            return 1
        return 0
    SCHEMA_PATH.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
