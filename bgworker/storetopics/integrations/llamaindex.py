"""LlamaIndex: one QueryEngineTool per store for a RouterQueryEngine (or an agent), its ToolMetadata's description
the store's summary (pip install storetopics[llamaindex]).

    from storetopics.integrations.llamaindex import query_engine_tools, refresh
    tools = query_engine_tools(conn, {"kitchen": kitchen_index.as_query_engine(), ...})
    router = RouterQueryEngine(selector=LLMSingleSelector.from_defaults(llm=llm), query_engine_tools=tools)
    ...
    refresh(tools, conn)          # after the summaries changed: the descriptions the router shows are updated

`refresh` changes the ToolMetadata objects in place (a RouterQueryEngine keeps the metadata objects it was given,
so the router built before sees the new descriptions).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psycopg

from ..errors import MissingExtra
from . import MAX_CHARS, StoreRef, current, plan

try:
    from llama_index.core.base.base_query_engine import BaseQueryEngine
    from llama_index.core.tools import QueryEngineTool, ToolMetadata
except ImportError as e:   # without the extra: say which one
    raise MissingExtra("storetopics.integrations.llamaindex", "llamaindex", e.name) from e

__all__ = ["query_engine_tools", "refresh", "StoreTools"]
ATTR = "_storetopics_ref"


def query_engine_tools(conn: psycopg.Connection, engines: Mapping[Any, Any] | Callable[[str], Any], *,
                       source: str | int | None = None, prefix: str | None = None, max_chars: int = MAX_CHARS,
                       return_direct: bool = False) -> list[QueryEngineTool]:
    """One QueryEngineTool per store, ToolMetadata(name, description) from its summary.

    engines: {store key: BaseQueryEngine} (a tool per entry, in order; a store with no summary yet is described as
    such until `refresh`), or a factory called with each store key the role may see in storetopics.stores (of
    `source`, a table name or source id), returning a query engine or None for no tool.  The key is
    (source_id, store key) where a store key is in several sources.  prefix: operator text put before the summary.
    max_chars: 1024 by default, the most ToolMetadata.to_openai_tool() accepts."""
    tools = []
    for p in plan(conn, engines, source=source, prefix=prefix, max_chars=max_chars):
        if not isinstance(p.target, BaseQueryEngine):
            raise TypeError(f"expected a LlamaIndex BaseQueryEngine for {p.key!r}, got {type(p.target).__name__} "
                            f"(an index: pass index.as_query_engine(llm=...))")
        tool = QueryEngineTool(query_engine=p.target,
                               metadata=ToolMetadata(name=p.name, description=p.description,
                                                     return_direct=return_direct))
        setattr(tool, ATTR, p.ref)
        tools.append(tool)
    return tools


def refresh(tools: Iterable[QueryEngineTool], conn: psycopg.Connection) -> list[QueryEngineTool]:
    """Set each tool's description to its store's current one where that differs (the summary changed), in place
    on its ToolMetadata; returns the tools changed.  Names stay; a tool whose store is gone keeps its description;
    tools not made by `query_engine_tools` are left alone."""
    mine = [t for t in tools if isinstance(getattr(t, ATTR, None), StoreRef)]
    changed = []
    for tool, text in zip(mine, current(conn, [getattr(t, ATTR) for t in mine])):
        if text is not None and text != tool.metadata.description:
            tool.metadata.description = text
            changed.append(tool)
    return changed


class StoreTools:
    """The tools and their refresh together: `StoreTools(conn, engines, ...).tools`, `.refresh()`."""

    def __init__(self, conn: psycopg.Connection, engines: Mapping[Any, Any] | Callable[[str], Any], **kwargs: Any):
        self.conn = conn
        self.tools = query_engine_tools(conn, engines, **kwargs)

    def refresh(self) -> list[str]:
        """The names of the tools whose description changed."""
        return [t.metadata.name for t in refresh(self.tools, self.conn)]
