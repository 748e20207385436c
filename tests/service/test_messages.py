"""What the rules errors and the CLI say: the file, the line, one problem per line, the
rule's name as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormguard.cli import main
from stormguard.ruleset import RulesError, RuleSet

GOOD = "{name: a, scope: ip, limit: 5, window: 60}"


def test_malformed_yaml_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - name: a\n    scope: ip\n   limit: 5\n")
    with pytest.raises(RulesError) as info:
        RuleSet.load(path)
    text = str(info.value)
    assert text.startswith(f"{path}: not valid YAML: line 4, column")
    assert "<unicode string>" not in text
    assert "rule -" not in text
    assert "field 'yaml'" not in text


def test_missing_file_names_the_path_and_the_os_error(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(RulesError) as info:
        RuleSet.load(path)
    assert str(info.value) == f"{path}: cannot read: No such file or directory (errno 2)"
    assert main(["rules", "validate", str(path)]) == 2
    assert f"{path}: cannot read: No such file or directory" in capsys.readouterr().err


def test_serve_lists_one_problem_per_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: a, scope: ip, limit: 0, window: 1}\n- {name: b, scope: x}\n")
    assert main(["serve", "--rules", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"stormguard: error: {bad}: invalid, nothing applied:"
    assert err[1].startswith("  rule 'a': field 'limit'")
    assert len(err) == 1 + 3  # a: limit; b: limit and window required


def test_problem_rule_is_the_name_without_quotes() -> None:
    with pytest.raises(RulesError) as info:
        RuleSet.from_data([{"name": "bad", "scope": "planet", "limit": 1, "window": 1},
                           {"scope": "ip"}])
    assert [p["rule"] for p in info.value.to_list()] == ["bad", "#2", "#2", "#2"]
    assert str(info.value).startswith("rule 'bad': field 'scope'")
    assert "rule #2: field 'name': is required" in str(info.value)


def test_duplicate_name_is_reported_when_the_duplicate_is_also_invalid() -> None:
    with pytest.raises(RulesError) as info:
        RuleSet.loads(f"- {GOOD}\n- {{name: a, scope: planet, limit: 5, window: 60}}\n")
    assert {(p.rule, p.field, p.problem) for p in info.value.problems} >= {
        ("a", "name", "duplicate rule name")}
    assert any(p.field == "scope" for p in info.value.problems)
    with pytest.raises(RulesError) as info:  # valid duplicates: reported once
        RuleSet.loads(f"- {GOOD}\n- {GOOD}\n")
    assert [(p.rule, p.problem) for p in info.value.problems] == [
        ("a", "duplicate rule name")]


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "rules: []\n", "[]\n"])
def test_an_empty_rules_file_is_reported(text: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    assert main(["rules", "validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert "OK" not in captured.out
    assert "no rules" in captured.err


def test_check_with_a_bad_limit_shows_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "k", "100/fortnight"]) == 2
    err = capsys.readouterr().err
    assert "unknown time unit 'fortnight'" in err
    assert main(["check", "k", "no-such-rule"]) == 2
    assert "unknown rule 'no-such-rule'" in capsys.readouterr().err
