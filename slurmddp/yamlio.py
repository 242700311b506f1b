"""The YAML reader for experiments, profiles and overrides.

PyYAML follows YAML 1.1, which reads `time: 1:30:00` as the base-60 integer 5400 and `1e-3` as a
string. A time limit must stay text and a learning rate must be a number, so this loader resolves
integers and floats the YAML 1.2 way, and it refuses duplicate keys instead of keeping the last.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    pass


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+|0o[0-7_]+)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load(text: str) -> Any:
    """Parse YAML text; raises yaml.YAMLError (with problem_mark) when malformed."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


def dump(data: Any) -> str:
    """YAML text of plain data, keys in their order, strings a YAML 1.1 reader would take for
    numbers quoted (the safe dumper does that)."""
    # PyYAML directly: OmegaConf.to_yaml builds a config first (~20 ms each, most of a 1000-element
    # sweep's submit). libyaml's emitter, where present, is ~10x faster than the pure one.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True))
