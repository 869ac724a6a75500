"""The internalisation probe's material: the enriched outputs of 8 file-system operations.

The paper probes whether OE's feedback ends up in the weights: it measures the probability a
model gives the enriched tool outputs of 8 file operations (its appendix has the questions; the
reference code has no probe, so the operations here are ours). They are the 8 GorillaFileSystem
methods OE lists the directory after (`bfcl_oe.FS_CHANGING`: cd, mkdir, touch, rm, rmdir, mv,
cp, echo), each run once from the file system of one BFCL training entry (`PROBE_ENTRY`, a
training-domain entry, so the probe reads what OE showed in training) through the real env
with OE on: the outputs are exactly what the feedback layer shows (the current path, the new
listing, the success text for a `None` result).

Each case is a chat in the model's own tool format (its chat template's tools block and
tool-call / tool-response turns, as Qwen3 is trained to read tools; the env's qwen prompt and
user-turn observations carry the same texts): the entry's instructions as the system message
with its function docs as `tools`, a user request, then per call the assistant's tool call and
the enriched output as a tool message. The calls before the probed one (a `cd` into the folder)
are context; the last message is the output scored (`experiments.probe.scoring`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from jaxscaffold.envs import bfcl
from jaxscaffold.envs.base import EnvError
from jaxscaffold.feedback.bfcl_oe import enrich_result

# A training entry with the file system alone (its function docs are the only tools: the
# shortest prompt): /alex/workspace holds log.txt, archive/ (empty) and .hidden_file.
PROBE_ENTRY = "multi_turn_base_1"
_INTO_WORKSPACE = ("cd", {"folder": "workspace"})

# operation -> (the user's request, the calls before it, the probed call's arguments)
OPERATIONS: dict[str, tuple[str, tuple, dict]] = {
    "cd": ("Go into the workspace folder.", (), {"folder": "workspace"}),
    "mkdir": ("In the workspace folder, create a directory named 'reports'.",
              (_INTO_WORKSPACE,), {"dir_name": "reports"}),
    "touch": ("In the workspace folder, create an empty file named 'todo.txt'.",
              (_INTO_WORKSPACE,), {"file_name": "todo.txt"}),
    "rm": ("In the workspace folder, delete the file 'log.txt'.",
           (_INTO_WORKSPACE,), {"file_name": "log.txt"}),
    "rmdir": ("In the workspace folder, remove the empty directory 'archive'.",
              (_INTO_WORKSPACE,), {"dir_name": "archive"}),
    "mv": ("In the workspace folder, move 'log.txt' into the 'archive' directory.",
           (_INTO_WORKSPACE,), {"source": "log.txt", "destination": "archive"}),
    "cp": ("In the workspace folder, copy 'log.txt' into the 'archive' directory.",
           (_INTO_WORKSPACE,), {"source": "log.txt", "destination": "archive"}),
    "echo": ("In the workspace folder, write 'All checks passed.' into 'log.txt'.",
             (_INTO_WORKSPACE,), {"content": "All checks passed.", "file_name": "log.txt"}),
}


@dataclasses.dataclass(frozen=True)
class ProbeCase:
    """One operation's chat (HF message dicts) and its tool schemas; the last message (a tool
    message) holds the enriched output scored."""

    operation: str
    messages: tuple[dict, ...]
    tools: tuple[dict, ...]

    @property
    def output(self) -> str:
        return self.messages[-1]["content"]


def _call_text(name: str, arguments: dict) -> str:
    """A call as the env's qwen tool format reads it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def probe_case(env: bfcl.BFCLEnv, task, operation: str) -> ProbeCase:
    """`operation`'s chat, played from a fresh reset of `task` in `env` (OE on)."""
    request, before, arguments = OPERATIONS[operation]
    first = env.reset(task).privileged
    messages = [{"role": "system", "content": first["instructions"]}, {"role": "user", "content": request}]
    for name, args in (*before, (operation, arguments)):
        seen = env.step(_call_text(name, args)).observation.privileged
        record = seen["tool_results"][0]
        if not record["ok"]:  # the probe's calls are fixed: a failure means the data changed
            raise EnvError(f"probe call {name}({args}) failed on {task.task_id}: {record['output']}")
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": dict(args)}]},
                     {"role": "tool", "content": seen["oe_text"]}]
    return ProbeCase(operation, tuple(messages), tuple(first["tools"]))


def probe_cases(operations: Sequence[str] = tuple(OPERATIONS)) -> list[ProbeCase]:
    """The probe's chats, one per operation (deterministic: a fixed entry and fixed calls)."""
    env = bfcl.BFCLEnv(bfcl.BFCLOptions(tool_format="qwen", oe_transform=enrich_result))
    task = next(t for t in bfcl.catalogue("train") if t.task_id == PROBE_ENTRY)
    try:
        return [probe_case(env, task, op) for op in operations]
    finally:
        env.close()
