"""LangChain: one retriever tool per store, its description the store's summary (pip install storetopics[langchain]).

    from storetopics.integrations.langchain import retriever_tools, refresh
    tools = retriever_tools(conn, {"kitchen": kitchen_pgvector, "garage": garage_pgvector}, k=4)
    agent = create_agent(model, tools)            # or llm.bind_tools(tools)
    ...
    refresh(tools, conn)                          # after the summaries changed: descriptions updated in place

Each tool is langchain_core's `create_retriever_tool` (a StructuredTool taking `query`) over the vector store's
retriever (`as_retriever(search_kwargs={"k": k})`), or over a retriever given as it is.  The tool's `metadata` holds
`{"storetopics": {...}}`: its store, so `refresh` finds it again.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psycopg

from ..errors import MissingExtra
from . import MAX_CHARS, StoreRef, current, plan

try:
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.tools import BaseTool
    try:
        from langchain_core.tools import create_retriever_tool
    except ImportError:   # older layouts
        from langchain.tools.retriever import create_retriever_tool  # type: ignore[no-redef]
except ImportError as e:   # without the extra: say which one
    raise MissingExtra("storetopics.integrations.langchain", "langchain", e.name) from e

__all__ = ["retriever_tools", "refresh", "StoreTools"]
META = "storetopics"


def _retriever(target: Any, k: int, search_kwargs: Mapping[str, Any] | None) -> BaseRetriever:
    if isinstance(target, BaseRetriever):
        return target
    if hasattr(target, "as_retriever"):
        return target.as_retriever(search_kwargs={"k": k, **(search_kwargs or {})})
    raise TypeError(f"expected a LangChain VectorStore or BaseRetriever, got {type(target).__name__}")


def retriever_tools(conn: psycopg.Connection, vectorstores: Mapping[Any, Any] | Callable[[str], Any], *,
                    source: str | int | None = None, prefix: str | None = None, k: int = 4,
                    search_kwargs: Mapping[str, Any] | None = None, max_chars: int = MAX_CHARS,
                    **tool_kwargs: Any) -> list[BaseTool]:
    """One retriever tool per store.

    vectorstores: {store key: VectorStore or BaseRetriever} (a tool per entry, in order; a store with no summary
    yet is described as such until `refresh`), or a factory called with each store key the role may see in
    storetopics.stores (of `source`, a table name or source id), returning a VectorStore, a retriever, or None for
    no tool.  The key is (source_id, store key) where a store key is in several sources.
    prefix: operator text put before the summary.  k, search_kwargs: for `as_retriever`.  tool_kwargs go to
    create_retriever_tool (document_prompt, document_separator, response_format)."""
    tools = []
    for p in plan(conn, vectorstores, source=source, prefix=prefix, max_chars=max_chars):
        tool = create_retriever_tool(_retriever(p.target, k, search_kwargs), p.name, p.description, **tool_kwargs)
        tool.metadata = {**(tool.metadata or {}), META: p.ref.to_dict()}
        tools.append(tool)
    return tools


def refresh(tools: Iterable[BaseTool], conn: psycopg.Connection) -> list[BaseTool]:
    """Set each tool's description to its store's current one where that differs (the summary changed); returns the
    tools changed.  Names stay; a tool whose store is gone keeps its description; tools not made by
    `retriever_tools` are left alone."""
    mine = [t for t in tools if isinstance((t.metadata or {}).get(META), Mapping)]
    refs = [StoreRef.from_dict(t.metadata[META]) for t in mine]
    changed = []
    for tool, ref, text in zip(mine, refs, current(conn, refs)):
        tool.metadata = {**tool.metadata, META: ref.to_dict()}    # the source id, once known
        if text is not None and text != tool.description:
            tool.description = text
            changed.append(tool)
    return changed


class StoreTools:
    """The tools and their refresh together: `StoreTools(conn, vectorstores, ...).tools`, `.refresh()`."""

    def __init__(self, conn: psycopg.Connection, vectorstores: Mapping[Any, Any] | Callable[[str], Any],
                 **kwargs: Any):
        self.conn = conn
        self.tools = retriever_tools(conn, vectorstores, **kwargs)

    def refresh(self) -> list[str]:
        """The names of the tools whose description changed."""
        return [t.name for t in refresh(self.tools, self.conn)]
