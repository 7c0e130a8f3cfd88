"""Bridges: agent frameworks' own pauses turned into nodbot reviews, and resumed the framework's
way once every pending call is decided.

| framework                          | module                    | function                 |
|------------------------------------|---------------------------|--------------------------|
| LangChain / LangGraph (HITL)       | `bridges.langgraph`       | `resolve_interruptions`  |
| pydantic-ai (deferred tools)       | `bridges.pydantic_ai`     | `resolve_deferred`       |
| OpenAI Agents SDK                  | `bridges.openai_agents`   | `resolve_interruptions`  |
| Microsoft Agent Framework          | `bridges.agent_framework` | `resolve_approvals`      |
| Google ADK (tool confirmations)    | `bridges.google_adk`      | `resolve_confirmations`  |

Each is an optional extra (`pip install 'nodbot[langgraph]'`, ...); importing this package
imports no framework, and a bridge module imports only its own. Every bridge goes through
`bridges.common.resolve_calls`: one review per pending call, keyed by the framework's native
call id, through the bot's approval request API (`core.client.ApprovalClient`); a decision
counts only as the one-use token the bot handed out for that run, call id, tool and
arguments; a call without a native call id is denied by the bridge.
"""
