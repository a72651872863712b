"""A job of a GitHub Actions workflow run as GitHub's runner runs it, for the example workflows' tests.

What it keeps of GitHub's semantics: ``${{ }}`` expressions (contexts, ``==``/``!=``/``&&``/``||``/``!``,
``always()``, ``success()``, ``failure()``, ``cancelled()``, ``hashFiles()``) substituted into ``run:`` and ``env:``
before anything runs, env values then passed literally (no shell expansion), the workflow's, job's and step's
``env:`` merged in that order, a ``run:`` step in ``bash -e {0}`` (``shell: bash``: ``bash --noprofile --norc -eo
pipefail {0}``) in the workspace, a step's ``if:`` (default ``success()``), ``continue-on-error``, the job failing
when a step fails, and the files behind ``$GITHUB_STEP_SUMMARY``, ``$GITHUB_OUTPUT`` and ``$GITHUB_ENV``. ``uses:``
steps are the caller's to stand in for (a checkout, a Python); so are the install steps it names.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||!|\(|\)|,)|(?P<num>\d+(?:\.\d+)?)"
                   r"|(?P<name>[A-Za-z_][\w.-]*))")
SHELLS = {None: ["bash", "-e"], "bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"]}


def load(path: Path) -> dict:
    """A workflow file, with ``on:`` kept as the key ``on`` (YAML 1.1 reads a bare ``on`` as True)."""
    data = yaml.safe_load(path.read_text())
    if True in data:
        data["on"] = data.pop(True)
    return data


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


class Expression:
    """A ``${{ }}`` expression of the subset above, evaluated against ``contexts`` and the job's state."""

    def __init__(self, source: str, contexts: dict, status: str, workspace: Path) -> None:
        self.tokens = [m for m in TOKEN.finditer(source) if m.group(0).strip()]
        if "".join(m.group(0) for m in self.tokens).replace(" ", "") != source.replace(" ", ""):
            raise ValueError(f"expression {source!r}: outside the subset this runner knows")
        self.at, self.contexts, self.status, self.workspace = 0, contexts, status, workspace

    def value(self) -> object:
        result = self._or()
        if self.at != len(self.tokens):
            raise ValueError(f"expression: unexpected {self.tokens[self.at].group(0)!r}")
        return result

    def _peek(self) -> str:
        return self.tokens[self.at].group(0).strip() if self.at < len(self.tokens) else ""

    def _take(self) -> re.Match:
        self.at += 1
        return self.tokens[self.at - 1]

    def _or(self) -> object:
        return self._chain("||", self._and, lambda left, right: left or right)

    def _and(self) -> object:
        return self._chain("&&", self._compare, lambda left, right: left and right)

    def _chain(self, op: str, operand, combine) -> object:
        """``operand (op operand)*``, folded left by ``combine`` (both sides evaluated: no call has effects)."""
        left = operand()
        while self._peek() == op:
            self._take()
            left = combine(left, operand())
        return left

    def _compare(self) -> object:
        left = self._unary()
        while self._peek() in ("==", "!="):
            op = self._take().group(0).strip()
            right = self._unary()
            same = _text(left).lower() == _text(right).lower()
            left = same if op == "==" else not same
        return left

    def _unary(self) -> object:
        if self._peek() == "!":
            self._take()
            return not self._unary()
        if self._peek() == "(":
            self._take()
            inner = self._or()
            self._take()
            return inner
        return self._atom()

    def _atom(self) -> object:
        token = self._take()
        if token.group("str"):
            return token.group("str")[1:-1].replace("''", "'")
        if token.group("num"):
            return float(token.group("num"))
        name = token.group("name")
        if self._peek() == "(":
            return self._call(name)
        return {"true": True, "false": False, "null": None}.get(name, self._lookup(name))

    def _call(self, name: str) -> object:
        self._take()
        args = []
        while self._peek() != ")":
            args.append(self._or())
            if self._peek() == ",":
                self._take()
        self._take()
        calls = {"always": lambda: True, "success": lambda: self.status == "success",
                 "failure": lambda: self.status == "failure", "cancelled": lambda: False,
                 "hashFiles": lambda *globs: _hash_files(self.workspace, globs)}
        if name not in calls:
            raise ValueError(f"expression: function {name}() is outside the subset this runner knows")
        return calls[name](*args)

    def _lookup(self, name: str) -> object:
        value: object = self.contexts
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value


def _hash_files(workspace: Path, globs: tuple[str, ...]) -> str:
    files = sorted(p for g in globs for p in workspace.glob(g) if p.is_file())
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest() if files else ""


def substitute(text: str, contexts: dict, status: str, workspace: Path) -> str:
    """``text`` with every ``${{ expr }}`` replaced by its value, as GitHub does before a step runs."""
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: _text(Expression(m.group(1).strip(), contexts, status,
                                                                      workspace).value()), text)


def condition(source: str | bool | None, contexts: dict, status: str, workspace: Path) -> bool:
    if source is None:
        return status == "success"
    if isinstance(source, bool):
        return source
    expr = source.strip()
    expr = expr[3:-2].strip() if expr.startswith("${{") else expr
    if not re.search(r"\b(always|success|failure|cancelled)\(", expr):
        expr = f"success() && ({expr})"  # GitHub's implicit status check
    return bool(Expression(expr, contexts, status, workspace).value())


@dataclass
class StepResult:
    name: str
    outcome: str  # success, failure, skipped, or stood-in (a uses: or install step the caller provides)
    output: str = ""


@dataclass
class JobResult:
    conclusion: str
    steps: list[StepResult] = field(default_factory=list)
    summary: str = ""

    def step(self, name: str) -> StepResult:
        return next(s for s in self.steps if s.name == name)

    @property
    def log(self) -> str:
        return "\n".join(f"== {s.name}: {s.outcome}\n{s.output}" for s in self.steps)


def _name(step: dict) -> str:
    return step.get("name") or step.get("uses") or step.get("run", "").splitlines()[0]


def run_job(workflow: dict, job: str, contexts: dict, workspace: Path, runner_env: dict[str, str],
            stand_ins: set[str], timeout: float = 600) -> JobResult:
    """Run ``job``'s steps in ``workspace``: ``uses:`` steps and the ``run:`` steps named in ``stand_ins`` are the
    caller's (recorded ``stood-in``), every other step runs as above. ``runner_env`` is the runner's own environment
    (PATH, HOME, ...), below the workflow's ``env:``."""
    spec = workflow["jobs"][job]
    files = {key: workspace.parent / f"{key.lower()}-{job}" for key in ("GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT",
                                                                        "GITHUB_ENV")}
    for path in files.values():
        path.write_text("")
    status, result = "success", JobResult("success")
    for step in spec["steps"]:
        name = _name(step)
        if not condition(step.get("if"), contexts, status, workspace):
            result.steps.append(StepResult(name, "skipped"))
            continue
        if "uses" in step or name in stand_ins:
            result.steps.append(StepResult(name, "stood-in"))
            continue
        env = {**runner_env, "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace),
               **{k: str(v) for k, v in files.items()}}
        for layer in (workflow.get("env"), spec.get("env"), step.get("env")):
            env.update({k: substitute(_text(v), contexts, status, workspace) for k, v in (layer or {}).items()})
        script = workspace.parent / f"step-{len(result.steps)}.sh"
        script.write_text(substitute(step["run"], contexts, status, workspace))
        proc = subprocess.run([*SHELLS[step.get("shell")], str(script)], cwd=workspace, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        outcome = "success" if proc.returncode == 0 else "failure"
        result.steps.append(StepResult(name, outcome, proc.stdout))
        if outcome == "failure" and not step.get("continue-on-error"):
            status = "failure"
    result.conclusion, result.summary = status, files["GITHUB_STEP_SUMMARY"].read_text()
    return result


def pull_request_context(number: int, base_ref: str, repository: str, head_repository: str, token: str) -> dict:
    """The contexts of a ``pull_request`` event: ``github`` with the fields the examples read."""
    return {"github": {"event_name": "pull_request", "base_ref": base_ref, "repository": repository,
                       "token": token, "workspace": "", "event": {"pull_request": {
                           "number": number, "head": {"repo": {"full_name": head_repository}},
                           "base": {"repo": {"full_name": repository}}}}}}


def runner_env(extra_path: list[Path]) -> dict[str, str]:
    """A runner's environment: PATH with ``extra_path`` first, HOME and the locale; nothing of this session's."""
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER")}
    return {**keep, "PATH": os.pathsep.join([*map(str, extra_path), "/usr/local/bin", "/usr/bin", "/bin"])}
