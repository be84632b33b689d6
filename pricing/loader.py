"""From YAML text or a parsed mapping to a checked document and its compiled `TenantPolicy`.

The caller reads files (pricing/ does no I/O); `source` only labels messages.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from pricing.errors import Finding, PolicyError
from pricing.models import MODEL_TAGS, P_FAIL_TAGS
from pricing.policy import PolicyDocument
from pricing.serving import TenantPolicy, compile_policy
from pricing.validation import check_policy
from pricing.values import SCALE_CONTEXT, UNKNOWN_SCALE, VALID_SCALES

# Where a field is a union, pydantic names the member it tried in the error's location
# (`pricing.quantile.level`); operators wrote `pricing.level`.
_UNION_TAGS = frozenset(MODEL_TAGS + P_FAIL_TAGS)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML would silently keep the last one,
    and a second `buyer-07:` entry must not quietly replace the first."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Hashable, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def parse_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise PolicyError(source, [Finding("", _yaml_message(exc))]) from None


def _yaml_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"not valid YAML{where}: {problem}"


def load_policy_text(text: str, source: str) -> TenantPolicy:
    """Parse and check one tenant policy written in YAML; PolicyError lists every finding."""
    return load_policy_data(parse_yaml(text, source), source)


def load_policy_data(data: object, source: str) -> TenantPolicy:
    """Check a parsed policy and compile it, so a request never pays for compiling."""
    return compile_policy(load_document(data, source))


def load_document(data: object, source: str) -> PolicyDocument:
    """The checked document of a parsed policy; PolicyError lists every finding."""
    if not isinstance(data, Mapping):
        raise PolicyError(source, [Finding("", "a policy must be a YAML mapping (key: value)")])
    try:
        document = PolicyDocument.model_validate(data, context={SCALE_CONTEXT: _scale_of(data)})
    except ValidationError as exc:
        raise PolicyError(source, _findings_from(exc)) from None
    findings = check_policy(document)
    if findings:
        raise PolicyError(source, findings)
    return document


def _scale_of(data: Mapping[str, Any]) -> int:
    unit = data.get("risk_unit")
    scale = unit.get("scale") if isinstance(unit, Mapping) else None
    if isinstance(scale, int) and not isinstance(scale, bool) and scale in VALID_SCALES:
        return scale
    return UNKNOWN_SCALE


def format_loc(loc: tuple[int | str, ...]) -> str:
    """('routes', 2, 'face_value') -> 'routes[2].face_value'."""
    out = ""
    prev: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_TAGS and prev in {"pricing", "p_fail"}:
            pass
        elif part == "[key]":
            out += " (key)"
        else:
            out += f".{part}" if out else str(part)
        prev = part
    return out


def _findings_from(exc: ValidationError) -> list[Finding]:
    findings: list[Finding] = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field; check its spelling against the policy reference"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "string_pattern_mismatch":
            msg = f"{err['input']!r} has the wrong form ({msg.lower()})"
        elif err["type"] in {"enum", "literal_error", "float_type", "int_type", "bool_type"}:
            msg = f"{msg} (got {err['input']!r})"
        finding = Finding(format_loc(tuple(err["loc"])), msg)
        if finding not in findings:
            findings.append(finding)
    return findings
