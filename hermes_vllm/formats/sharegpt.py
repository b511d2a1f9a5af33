"""ShareGPT conversations (the Hermes function-calling datasets) and their OpenAI form.

A ShareGPT value is a Hermes message body (:mod:`hermes_vllm.formats.openai`): ``gpt`` values
hold call blocks, ``tool`` values hold response blocks, free text is escaped. Conversions go
through Hermes messages, so ShareGPT and the prompt share one layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.openai import HermesMessage, hermes_to_openai, openai_to_hermes
from hermes_vllm.formats.prompt import Message, Tool
from hermes_vllm.spans import split_spans

ShareGPTRole = Literal["system", "human", "gpt", "tool"]
TO_OPENAI_ROLE: dict[str, str] = {"system": "system", "human": "user", "gpt": "assistant", "tool": "tool"}
FROM_OPENAI_ROLE = {v: k for k, v in TO_OPENAI_ROLE.items()}


class ShareGPTMessage(BaseModel):
    """One ShareGPT turn: ``{"from": ..., "value": ...}``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    from_: ShareGPTRole = Field(alias="from")
    value: str


class ShareGPTConversation(BaseModel):
    """A ShareGPT conversation whose turn order a Hermes model can be trained on.

    It starts with a system or human turn; a ``gpt`` turn follows a human or tool turn; a
    ``tool`` turn follows a ``gpt`` turn that makes a call, or another tool turn answering the
    same ``gpt`` turn. Calls are found in the tags of the dialect passed as validation context
    ``{"dialect": ...}`` (default ``hermes``).
    """

    model_config = ConfigDict(extra="forbid")

    conversations: list[ShareGPTMessage] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_order(self, info: ValidationInfo) -> ShareGPTConversation:
        d = get_dialect((info.context or {}).get("dialect", "hermes"))
        turns = self.conversations
        if turns[0].from_ not in ("system", "human"):
            raise ValueError(f"a conversation starts with a system or human turn, not {turns[0].from_!r}")
        for i, (prev, cur) in enumerate(pairwise(turns), start=1):
            if cur.from_ == "gpt" and prev.from_ not in ("human", "tool"):
                raise ValueError(f"turn {i}: a gpt turn follows a human or tool turn, not {prev.from_!r}")
            calls = prev.from_ == "gpt" and any(s.kind == "call" for s in split_spans(prev.value, d))
            if cur.from_ == "tool" and not (calls or prev.from_ == "tool"):
                raise ValueError(
                    f"turn {i}: a tool turn follows a gpt turn that makes a call, or a tool turn"
                )
        return self


def sharegpt_to_openai(
    conversation: ShareGPTConversation, dialect: str | Dialect = "hermes", mask_output: bool = False
) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """``(messages, tools)`` in OpenAI form; tools come from the system turn's preamble."""
    hermes: list[HermesMessage] = [
        {"role": TO_OPENAI_ROLE[m.from_], "content": m.value} for m in conversation.conversations
    ]
    return hermes_to_openai(hermes, dialect, mask_output)


def openai_to_sharegpt(
    messages: Sequence[Message],
    tools: Sequence[Tool] | None = None,
    dialect: str | Dialect = "hermes",
    mask_output: bool = False,
) -> ShareGPTConversation:
    """The ShareGPT conversation of OpenAI ``messages``; ``ValidationError`` if its order is not one."""
    d = get_dialect(dialect)
    turns = [
        {"from": FROM_OPENAI_ROLE[m["role"]], "value": m["content"]}
        for m in openai_to_hermes(messages, tools, d, mask_output)
    ]
    return ShareGPTConversation.model_validate({"conversations": turns}, context={"dialect": d})
