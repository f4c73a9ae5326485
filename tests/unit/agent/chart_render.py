"""A renderer for the subset of Helm's Go templates the agent's chart uses, for machines without `helm`.

It knows `{{ .Values.x }}`, `.Release.*`, `.Chart.*`, `include`, `toYaml`, `quote`, `nindent`, `default`, `not`,
`fail`, and the `if` / `with` / `define` blocks with `{{-` / `-}}` whitespace trimming (text/template's rules: a
dash trims all adjacent white space, newlines included). Anything else raises, so a chart edit that goes beyond
the subset fails the test instead of rendering wrongly; `helm template` (when installed) checks the real thing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from pathlib import Path

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.DOTALL)


class ChartError(Exception):
    """`fail` was called, or the template uses what this renderer does not know."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    position = 0
    for match in _ACTION.finditer(text):
        before = text[position:match.start()]
        if match.group(1) == "-":
            before = before.rstrip()
        out.append(("text", before))
        out.append(("action", match.group(2)))
        position = match.end()
        if match.group(3) == "-":
            rest = text[position:]
            position += len(rest) - len(rest.lstrip())
    out.append(("text", text[position:]))
    return out


def _tree(tokens: list[tuple[str, str]], start: int = 0) -> tuple[list[Any], int]:
    nodes: list[Any] = []
    i = start
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == "text":
            nodes.append(value)
        elif value == "end":
            return nodes, i
        elif value.split()[0] in ("if", "with", "define"):
            keyword, argument = value.split(None, 1)
            body, i = _tree(tokens, i + 1)
            nodes.append((keyword, argument, body))
        elif not value.startswith("/*"):
            nodes.append(("expr", value))
        i += 1
    return nodes, i


class Renderer:
    def __init__(self, chart: Path, values: dict[str, Any], *, release: str = "agent", namespace: str = "ops"):
        chart_meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        self.root = {"Values": values, "Release": {"Name": release, "Namespace": namespace},
                     "Chart": {"Name": chart_meta["name"], "AppVersion": chart_meta["appVersion"],
                               "Version": chart_meta["version"]}}
        self.defines: dict[str, list[Any]] = {}
        for helper in sorted((chart / "templates").glob("_*.tpl")):
            self._render(_tree(_tokens(helper.read_text()))[0], self.root)

    def render(self, template: Path) -> str:
        return self._render(_tree(_tokens(template.read_text()))[0], self.root)

    def _render(self, nodes: list[Any], dot: Any) -> str:
        out = []
        for node in nodes:
            if isinstance(node, str):
                out.append(node)
            elif node[0] == "define":
                self.defines[node[1].strip('"')] = node[2]
            elif node[0] == "if":
                if self._value(node[1], dot):
                    out.append(self._render(node[2], dot))
            elif node[0] == "with":
                value = self._value(node[1], dot)
                if value:
                    out.append(self._render(node[2], value))
            else:
                value = self._pipeline(node[1], dot)
                out.append("" if value is None else str(value).lower() if isinstance(value, bool) else str(value))
        return "".join(out)

    def _value(self, term: str, dot: Any) -> Any:
        words = term.split()
        if words[0] == "not":
            return not self._value(" ".join(words[1:]), dot)
        if term.startswith('"'):
            return term.strip('"')
        if term == ".":
            return dot
        if term.startswith("."):
            value: Any = self.root if term.split(".")[1] in self.root else dot
            for part in term.split(".")[1:]:
                value = value.get(part) if isinstance(value, dict) else None
            return value
        if re.fullmatch(r"-?\d+", term):
            return int(term)
        raise ChartError(f"unknown term {term!r}")

    def _pipeline(self, text: str, dot: Any) -> Any:
        stages = [s.strip() for s in text.split("|")]
        head = stages[0].split(None, 1)
        if head[0] == "fail":
            raise ChartError(head[1].strip('"'))
        if head[0] == "include":
            name, argument = head[1].split(None, 1)
            value: Any = self._render(self.defines[name.strip('"')], self._value(argument, dot))
        elif head[0] == "toYaml":
            value = yaml.safe_dump(self._value(head[1], dot), sort_keys=False).rstrip()
        else:
            value = self._value(stages[0], dot)
        for stage in stages[1:]:
            function, *arguments = stage.split()
            if function == "quote":
                value = '"' + str(value).replace('"', '\\"') + '"'
            elif function == "nindent":
                pad = " " * int(arguments[0])
                value = "\n" + "\n".join(pad + line if line else line for line in str(value).splitlines())
            elif function == "default":
                value = value or self._value(arguments[0], dot)
            else:
                raise ChartError(f"unknown function {function!r}")
        return value
