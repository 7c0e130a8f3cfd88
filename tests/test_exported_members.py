"""The public surface of `core`: what `__all__` promises is there, and nothing leaks."""

from __future__ import annotations

import subprocess
import sys

from nodbot import core

EXPECTED = {
    "Agent",
    "Announcement",
    "ApprovalAlreadyConsumed",
    "ApprovalAlreadyDecided",
    "ApprovalAlreadyVoted",
    "ApprovalDenied",
    "ApprovalError",
    "ApprovalEvent",
    "ApprovalMismatchError",
    "ApprovalNotDecided",
    "ApprovalNotFound",
    "ApprovalPending",
    "ApprovalPort",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalStatus",
    "ApprovalStore",
    "AssistantMessage",
    "AutoDeny",
    "CallbackApproval",
    "ChatCompletionsModel",
    "ChatModel",
    "ChatResponse",
    "Claim",
    "ClaimOutcome",
    "ConfigurationError",
    "Decided",
    "Decision",
    "DeferredApproval",
    "Delivery",
    "DeliveryLost",
    "Effects",
    "Executor",
    "HumanMessage",
    "InterruptRule",
    "InvalidArgumentsError",
    "InvalidDecisionError",
    "InvalidQuestionError",
    "MessageAlreadyProcessed",
    "LoopResult",
    "MemoryApprovalStore",
    "Message",
    "NodbotError",
    "NotPendingError",
    "ResumeError",
    "RunPausedError",
    "Outbox",
    "PendingCall",
    "PortAnswer",
    "Predicate",
    "QUESTION_TOOL",
    "Question",
    "QuestionPending",
    "QuestionUnanswered",
    "RunConflict",
    "RunError",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "ScriptedChat",
    "MemoryRunStore",
    "NewDelivery",
    "advance_run",
    "Spent",
    "SqlApprovalStore",
    "StoreError",
    "StoreSchemaError",
    "CallInFlight",
    "StoreUnavailableError",
    "SystemMessage",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDecision",
    "ToolError",
    "ToolExecutionError",
    "ToolInterrupt",
    "ToolMessage",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "ToolUsageError",
    "UnknownToolError",
    "Waiting",
    "__version__",
    "all_fields",
    "answer_of",
    "any_field",
    "approval_interrupt_id",
    "arguments_digest",
    "as_decision",
    "check_edit_arguments",
    "eq",
    "ge",
    "gt",
    "is_question",
    "le",
    "lt",
    "matches",
    "merge_edit",
    "run_tool_loop",
    "should_interrupt",
    "wait_for_decision",
}


def test_all_lists_the_public_api() -> None:
    assert set(core.__all__) == EXPECTED
    assert len(core.__all__) == len(EXPECTED)  # no name listed twice


def test_every_listed_member_exists() -> None:
    missing = [name for name in core.__all__ if not hasattr(core, name)]
    assert missing == []


def test_every_exported_exception_derives_from_nodbot_error() -> None:
    members = [getattr(core, name) for name in core.__all__]
    errors = [m for m in members if isinstance(m, type) and issubclass(m, BaseException)]
    assert len(errors) == 31
    assert [e.__name__ for e in errors if not issubclass(e, core.NodbotError)] == []
    assert len({e.kind for e in errors}) == len(errors)  # each reports its own kind


def test_public_classes_have_docstrings() -> None:
    classes = [getattr(core, n) for n in core.__all__ if isinstance(getattr(core, n), type)]
    assert [cls.__name__ for cls in classes if not cls.__doc__] == []


def test_the_core_imports_no_agent_framework() -> None:
    """Each bridge is an extra: importing the core, its client and the bridges' common part
    loads none of the frameworks (only a bridge module of its own does)."""
    code = (
        "import sys\n"
        "import nodbot, nodbot.core, nodbot.core.client, nodbot.core.bridges\n"
        "import nodbot.core.bridges.common, nodbot.core.bridges.hosted, nodbot.bot.serve\n"
        "frameworks = ('langgraph', 'langchain', 'pydantic_ai', 'agents', 'agent_framework',\n"
        "              'google.adk', 'mcp')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in frameworks\n"
        "             or m.startswith('google.adk')))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert found == "[]"
