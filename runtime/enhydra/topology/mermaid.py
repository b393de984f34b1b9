"""The topology as a Mermaid flowchart, for READMEs and reviews of an upgrade."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def _id(prefix: str, name: str) -> str:
    return prefix + "_" + re.sub(r"[^A-Za-z0-9]", "_", name)


def _label(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


def to_mermaid(topology: Mapping[str, Any]) -> str:
    """Topics as stadiums, the aggregate, projections and reactions as boxes, stores as
    cylinders."""
    lines = ["flowchart LR"]
    handlers = {h.get("store"): h for h in topology.get("handlers", [])}
    store_names = [s["name"] for s in topology["stores"]]
    for topic in topology["input_topics"]:
        tid = _id("topic", topic["name"])
        lines.append(f"  {tid}([{_label(topic['name'] + ' · ' + str(topic['partitions']) + 'p')}])")
    for store in topology["stores"]:
        handler = handlers.get(store["name"], {})
        decide = handler.get("decide")
        shown = decide if isinstance(decide, str) else "decide/apply (extended)"
        pid = _id("proc", store["name"])
        lines.append(f"  {pid}[{_label(store['name'] + ': ' + str(shown))}]")
        sid = _id("store", store["name"])
        lines.append(f"  {sid}[({_label(store['name'] + ' store')})]")
        cid = _id("topic", store["changelog"])
        lines.append(f"  {cid}([{_label(store['changelog'])}])")
        for topic in topology["input_topics"]:
            lines.append(f"  {_id('topic', topic['name'])} --> {pid}")
        lines.append(f"  {pid} <--> {sid}")
        lines.append(f"  {sid} -. changelog .-> {cid}")
        for topic in topology["output_topics"]:
            tid = _id("topic", topic["name"])
            lines.append(f"  {tid}([{_label(topic['name'])}])")
            lines.append(f"  {pid} --> {tid}")
    for topic in topology["internal_topics"]:
        if topic.get("role") == "dlq":
            tid = _id("topic", topic["name"])
            lines.append(f"  {tid}([{_label(topic['name'] + ' (dead letters)')}])")
            for name in store_names:
                lines.append(f"  {_id('proc', name)} -. failures .-> {tid}")
    for projection in topology.get("projections", []):
        pid = _id("projection", projection["name"])
        plugin = f" (plugin {projection['plugin']})" if projection.get("plugin") else ""
        lines.append(f"  {pid}[{_label('projection ' + projection['name'] + plugin)}]")
        sid = _id("pstore", projection["name"])
        lines.append(f"  {sid}[({_label(projection['store'] + ' store')})]")
        cid = _id("topic", projection["changelog"])
        lines.append(f"  {cid}([{_label(projection['changelog'])}])")
        lines.append(f"  {_id('topic', projection['source'])} --> {pid}")
        lines.append(f"  {pid} <--> {sid}")
        lines.append(f"  {sid} -. changelog .-> {cid}")
    for reaction in topology.get("reactions", []):
        rid = _id("reaction", reaction["name"])
        label = f"reaction {reaction['name']} (from {reaction['source']})"
        lines.append(f"  {rid}[{_label(label)}]")
        tid = _id("topic", reaction["input"])
        lines.append(f"  {tid}([{_label(reaction['input'])}])")
        lines.append(f"  {tid} --> {rid}")
        for target in reaction.get("sends", []):
            sent = _id("topic", target)
            lines.append(f"  {sent}([{_label(target)}])")
            lines.append(f"  {rid} --> {sent}")
    return "\n".join(lines) + "\n"
