"""The `api` section of the configuration: bearer tokens, their principals and scopes."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodbot.bot.config import ApiConfig, ApiToken, Config, ConfigError, load_config
from tests.bot.test_config import EXAMPLE, only_problem, problems_of, write

SECRET = "s3cret-token-of-ana"


def test_tokens_come_from_the_environment(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        api:
          tokens:
            - name: ana
              token: ${NODBOT_TOKEN_ANA}
              scopes: [approvals:read, approvals:decide]
            - name: ops-bot
              token: ${NODBOT_TOKEN_OPS:-ops-bot-default-token}
              scopes: [runs:write]
        """,
    )
    config = load_config(path, environ={"NODBOT_TOKEN_ANA": SECRET})
    ana, ops = config.api.tokens
    assert (ana.name, ana.token.get_secret_value()) == ("ana", SECRET)
    assert ana.scopes == ["approvals:read", "approvals:decide"]
    assert (ops.name, ops.token.get_secret_value()) == ("ops-bot", "ops-bot-default-token")
    assert ops.scopes == ["runs:write"]


def test_no_api_section_means_no_tokens(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "server: {}\n")).api == ApiConfig(tokens=[])


def test_a_token_is_hidden_in_reprs_and_dumps() -> None:
    token = ApiToken.model_validate({"name": "ana", "token": SECRET, "scopes": ["approvals:read"]})
    config = Config.model_validate({"api": {"tokens": [token.model_dump()]}})
    assert SECRET not in repr(token)
    assert SECRET not in repr(config)
    assert SECRET not in config.model_dump_json()
    assert config.api.tokens[0].token.get_secret_value() == SECRET


@pytest.mark.parametrize("written", ["too-short", "${NODBOT_TOKEN_ANA}"])
def test_a_short_token_is_refused_without_showing_it(tmp_path: Path, written: str) -> None:
    path = write(
        tmp_path,
        f"""
        api:
          tokens:
            - name: ana
              token: {written}
              scopes: [approvals:read]
        """,
    )
    with pytest.raises(ConfigError) as refused:
        load_config(path, environ={"NODBOT_TOKEN_ANA": "tiny-secret"})
    assert refused.value.problems == [
        f"{path}:4: api.tokens.0.token: a token needs at least 16 characters"
    ]
    assert "too-short" not in str(refused.value) and "tiny-secret" not in str(refused.value)


def test_a_token_that_is_not_a_string_is_refused_without_showing_it(tmp_path: Path) -> None:
    problem = only_problem(
        tmp_path,
        """
        api:
          tokens:
            - {name: ana, token: 12345678901234567890, scopes: [approvals:read]}
        """,
    )
    assert problem.endswith(
        "api.tokens.0.token: expected a secret string such as ${NODBOT_TOKEN_ANA}, not a number"
    )
    assert "12345678901234567890" not in problem


def test_names_and_tokens_are_unique(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path,
        f"""
        api:
          tokens:
            - {{name: ana, token: {SECRET}, scopes: [approvals:read]}}
            - {{name: ana, token: another-token-0000, scopes: [approvals:read]}}
            - {{name: bob, token: {SECRET}, scopes: [approvals:read]}}
        """,
    )
    file = tmp_path / "nodbot.yml"
    assert found == [
        f"{file}:4: api.tokens.1.name: the name 'ana' is taken by api.tokens.0",
        f"{file}:5: api.tokens.2.token: the same token as api.tokens.0; give each its own",
    ]
    assert SECRET not in "\n".join(found)


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        ("[]", "api.tokens.0.scopes: expected at least one of approvals:read, approvals:decide"),
        (
            "[approvals:read, approvals:read]",
            "api.tokens.0.scopes: each scope may be listed once",
        ),
        ("[approvals:write]", "api.tokens.0.scopes.0: Input should be 'approvals:read'"),
    ],
)
def test_scopes_are_a_non_empty_subset(tmp_path: Path, scopes: str, expected: str) -> None:
    problem = only_problem(
        tmp_path,
        f"""
        api:
          tokens:
            - {{name: ana, token: {SECRET}, scopes: {scopes}}}
        """,
    )
    assert expected in problem


def test_a_token_needs_every_key_and_no_other(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path,
        """
        api:
          tokens:
            - {name: ana, scopes: [approvals:read], role: admin}
            - {name: 'not a name', token: long-enough-token-1, scopes: [runs:write]}
        """,
    )
    file = tmp_path / "nodbot.yml"
    assert sorted(found) == [
        f"{file}:3: api.tokens.0.role: unknown key 'role'; expected one of: name, token, scopes",
        f"{file}:3: api.tokens.0.token: the required key 'token' is missing",
        f"{file}:4: api.tokens.1.name: expected a principal of letters, digits and - _ . + @ "
        "(a name, a Slack user id or an email address), not 'not a name'",
    ]


def test_the_example_gives_out_no_token_until_its_api_block_is_uncommented(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_config(EXAMPLE).api.tokens == []
    text = EXAMPLE.read_text()
    block = text[text.index("# api:") :].split("\n\n", 1)[0]
    uncommented = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    path = tmp_path / "nodbot.yml"
    path.write_text(text.replace(block, uncommented))
    monkeypatch.delenv("NODBOT_TOKEN_ANA", raising=False)
    monkeypatch.setenv("NODBOT_TOKEN_DASHBOARD", "dashboard-token-from-env")
    with pytest.raises(ConfigError, match="NODBOT_TOKEN_ANA"):
        load_config(path)  # a forgotten variable is an error, never a default token
    monkeypatch.setenv("NODBOT_TOKEN_ANA", "ana-token-from-the-env")
    tokens = load_config(path).api.tokens
    assert [(token.name, token.scopes) for token in tokens] == [
        ("ana", ["approvals:read", "approvals:decide"]),
        ("dashboard", ["approvals:read"]),
    ]
    assert tokens[1].token.get_secret_value() == "dashboard-token-from-env"
