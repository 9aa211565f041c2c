"""What help texts and the README say of each hypothesis profile agrees with the registered settings.

Every help text of ``python -m harness`` (:func:`harness.cli.build_parser`), of ``python -m harness bench``
(:func:`harness.bench.command.build_parser`) and of the pytest options (:mod:`harness.plugin.options`), and
every README table row, is searched for the names in :data:`harness.plugin.profiles.HYPOTHESIS_PROFILES`.
The text after a mention, up to the next mention of a profile, is that profile's: the number of examples
it states must be ``max_examples``, "shrink"/"shrunk" and "no shrinking" must agree with ``Phase.shrink``
in ``phases``, and "derandomized" with ``derandomize``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import hypothesis
import pytest
from hypothesis import Phase

from harness import cli
from harness.plugin import options, profiles

README = Path(__file__).resolve().parent.parent / "README.md"
NAMES = profiles.HYPOTHESIS_PROFILES
# A profile named as a word of its own (case-sensitive: "CI" the variable is not the profile).
MENTION = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, NAMES)) + r")(?![\w-])")
# "`ci` (25, ..." / "default ci: 25 ...": a count right after the name; "25 derandomized examples": a count
# of examples anywhere in the profile's text.
COUNT_AFTER_NAME = re.compile(r"^[`'\"]?\s*[(:]\s*(\d+)\b")
COUNT_OF_EXAMPLES = re.compile(r"\b(\d+)(?:\s+[\w-]+)?\s+examples?\b")
NO_SHRINKING = re.compile(r"\b(?:no|without|not|never)\s+(?:shrinking|shrunk|shrink)\b|\bunshrunk\b")
SHRINKING = re.compile(r"\bshrink(?:s|ing)?\b|\bshrunk\b")
NOT_DERANDOMIZED = re.compile(r"\bnot\s+derandomi[sz]ed\b")
DERANDOMIZED = re.compile(r"\bderandomi[sz]ed\b")


def _parser_texts(parser: argparse.ArgumentParser, where: str) -> list[tuple[str, str]]:
    texts = [(f"{where} description", parser.description or ""), (f"{where} epilog", parser.epilog or "")]
    for action in parser._actions:
        name = "/".join(action.option_strings) or action.dest
        if action.help and action.help is not argparse.SUPPRESS:
            texts.append((f"{where} {name}", action.help))
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                texts.append((f"{where} {choice.dest}", choice.help or ""))
            for command, sub in action.choices.items():
                texts += _parser_texts(sub, f"{where} {command}")
    return texts


class _OptionRecorder:
    """Stands in for pytest's parser: records each option's help."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []

    def getgroup(self, *args, **kwargs):
        return self

    def addoption(self, *names, **attrs):
        self.texts.append((f"pytest {'/'.join(names)}", attrs.get("help") or ""))


def help_texts() -> list[tuple[str, str]]:
    from harness.bench import command

    recorder = _OptionRecorder()
    options.add_options(recorder)
    return (_parser_texts(cli.build_parser(), "python -m harness")
            + _parser_texts(command.build_parser(), "python -m harness bench") + recorder.texts)


def readme_rows() -> list[tuple[str, str]]:
    return [(f"README.md:{number}", line) for number, line in enumerate(README.read_text().splitlines(), 1)
            if line.lstrip().startswith("|")]


def claims(text: str) -> dict[str, list]:
    """``{profile: [(claim, value, excerpt), ...]}`` for every profile the text mentions."""
    mentions = list(MENTION.finditer(text))
    found: dict[str, list] = {}
    for mention, following in zip(mentions, [*mentions[1:], None]):
        part = text[mention.end():following.start() if following else len(text)]
        stated = found.setdefault(mention.group(1), [])
        excerpt = (mention.group(1) + part)[:120]
        counts = {int(m) for m in COUNT_OF_EXAMPLES.findall(part)}
        after = COUNT_AFTER_NAME.match(part)
        if after:
            counts.add(int(after.group(1)))
        stated += [("max_examples", count, excerpt) for count in counts]
        if NO_SHRINKING.search(part):
            stated.append(("shrinks", False, excerpt))
        elif SHRINKING.search(part):
            stated.append(("shrinks", True, excerpt))
        if NOT_DERANDOMIZED.search(part):
            stated.append(("derandomize", False, excerpt))
        elif DERANDOMIZED.search(part):
            stated.append(("derandomize", True, excerpt))
    return found


def registered(name: str) -> dict[str, object]:
    profiles.register_hypothesis_profiles()
    chosen = hypothesis.settings.get_profile(name)
    return {"max_examples": chosen.max_examples, "shrinks": Phase.shrink in chosen.phases,
            "derandomize": chosen.derandomize}


@pytest.fixture(scope="module")
def texts() -> list[tuple[str, str]]:
    return help_texts() + readme_rows()


@pytest.mark.parametrize("name", NAMES)
def test_every_claim_about_a_profile_matches_its_settings(name, texts):
    truth = registered(name)
    wrong = [f"{where}: says {claim}={value} ({excerpt!r}), registered {truth[claim]}"
             for where, text in texts for claim, value, excerpt in claims(text).get(name, [])
             if truth[claim] != value]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", NAMES)
def test_the_readme_describes_every_profile(name):
    stated = [claim for _, text in readme_rows() for claim, _, _ in claims(text).get(name, [])]
    assert "max_examples" in stated, f"no README table row states how many examples {name} runs"


def test_no_text_names_a_profile_that_is_not_registered():
    # The selfcheck profile was removed (it was ci's settings); the kill matrix uses ci.
    stale = [where for where, text in help_texts() + readme_rows()
             if "profile" in text and re.search(r"\{[^}]*\bselfcheck\b[^}]*\}|`selfcheck` \(", text)]
    assert not stale, f"a profile that no longer exists is named: {stale}"


def test_the_claims_are_read():
    # The checks above must not pass for want of finding anything.
    found = claims("`ci` (25, derandomized, no shrinking) and `nightly` (400 examples, shrinking); default dev: 5")
    assert {(claim, value) for claim, value, _ in found["ci"]} == {
        ("max_examples", 25), ("shrinks", False), ("derandomize", True)}
    assert ("shrinks", True) in [(c, v) for c, v, _ in found["nightly"]]
    assert ("max_examples", 5) in [(c, v) for c, v, _ in found["dev"]]
    assert not claims("set CI=1 to get the CI defaults")
