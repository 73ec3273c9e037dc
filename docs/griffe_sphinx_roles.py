"""A griffe extension for the docs build: Sphinx roles in docstrings become Markdown.

The package's docstrings are Google style with Sphinx cross-reference roles
(``:class:`~lightning_rex.core.window.Window```). mkdocstrings renders Markdown, where such a
role would show as literal text. This extension rewrites every role, before rendering, into
an autorefs link when its target is an object this site documents, and into a code span
otherwise (torch, Lightning, BoTorch, private or undocumented objects).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`([^`]+)`")
# modules left out of the API pages (being written elsewhere, or command-line entry points)
_SKIP = (
    "lightning_rex.__main__",
    "lightning_rex.sim.cli.simulate",
    "lightning_rex.sim.cli.trace",
    "lightning_rex.tools.bench",
    "lightning_rex.tools.report",
    "lightning_rex.tools.plots",
    "lightning_rex.tools.windows",
)


def _documented(obj: griffe.Object | griffe.Alias) -> bool:
    """Whether the API pages render ``obj`` (so an autorefs link to it resolves)."""
    path = obj.path
    if not path.startswith("lightning_rex.") or path.startswith(_SKIP):
        return False
    parts = path.split(".")
    if any(p.startswith("_") for p in parts[1:]):
        return False
    node: Any = obj
    while node is not None and node.path != "lightning_rex":
        if not node.is_module and not node.docstring:
            return False
        node = node.parent
    return True


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring once the object tree is complete."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite the docstrings of every object of the package.

        Args:
            pkg: The loaded package.
            **kwargs: Unused.
        """
        self._walk(pkg, pkg)

    def _walk(self, obj: griffe.Object, root: griffe.Module) -> None:
        if obj.docstring is not None:
            value = obj.docstring.value
            obj.docstring.value = _ROLE.sub(lambda m: self._replace(m, obj, root), value)
        for member in obj.members.values():
            if not member.is_alias and member.parent is obj:
                self._walk(member, root)

    def _replace(self, m: re.Match[str], where: griffe.Object, root: griffe.Module) -> str:
        text = m.group(1).strip()
        title = None
        explicit = re.fullmatch(r"(.+?)\s*<(.+)>", text)
        if explicit:
            title, text = explicit.group(1), explicit.group(2)
        short = text.startswith("~")
        target = text.lstrip("~.")
        shown = title or (target.rsplit(".", 1)[-1] if short else target)
        resolved = self._resolve(target, where, root)
        if resolved is None:
            return f"`{shown}`"
        return f"[`{shown}`][{resolved}]"

    @staticmethod
    def _resolve(target: str, where: griffe.Object, root: griffe.Module) -> str | None:
        candidates = [target]
        scope: Any = where
        while scope is not None:  # relative names: the object's own scope outwards
            candidates.append(f"{scope.path}.{target}")
            scope = scope.parent
        for path in candidates:
            if path == "lightning_rex" or not path.startswith("lightning_rex."):
                continue
            try:
                obj = root[path[len("lightning_rex.") :]]
                final = obj.final_target if obj.is_alias else obj
            except Exception:  # not found, or an alias to something outside the package
                continue
            if _documented(final):
                return final.path
        return None
