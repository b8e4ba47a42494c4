"""The chart's README: the commands an operator copies from it match the code.

Plain text checks, and the install command rendered with helm (skipped without it).
"""

from __future__ import annotations

import re

import yaml

from contracts.names import SEARCH_ATTRIBUTE_TYPES
from tests.charts.chart import CHART, helm_run, needs_helm


def _registration_command(readme: str) -> str:
    """The README's `temporal operator search-attribute create` command, continuation lines
    joined."""
    (command,) = re.findall(
        r"^[^\n]*temporal operator search-attribute create(?:[^\n]*\\\n)*[^\n]*$",
        readme,
        flags=re.MULTILINE,
    )
    return command.replace("\\\n", " ")


def test_readme_registers_every_search_attribute_with_its_type() -> None:
    """An attribute left out of the README's command is never registered, and every agent
    task's upsert of it then fails (TemperedToolCalls once was)."""
    command = _registration_command((CHART / "README.md").read_text())
    pairs = re.findall(r"--name\s+(\S+)\s+--type\s+(\S+)", command)
    assert len(pairs) == command.count("--name") == command.count("--type")
    registered = dict(pairs)
    assert len(registered) == len(pairs)  # no name twice
    assert registered == {str(name): kind for name, kind in SEARCH_ATTRIBUTE_TYPES.items()}


def _command(readme: str, start: str) -> str:
    """The README's one command that begins with `start`, continuation lines joined and its
    trailing comment dropped."""
    (command,) = re.findall(
        rf"^{re.escape(start)}(?:[^\n]*\\\n)*[^\n]*$", readme, flags=re.MULTILINE
    )
    return re.sub(r"\s+#[^\n]*$", "", command.replace("\\\n", " "))


@needs_helm
def test_the_install_command_renders_workers_that_use_the_secret_made_before_it() -> None:
    """Followed literally, the install named a Secret no step created (every pod stuck in
    CreateContainerConfigError) and an image nothing builds: the README now builds and pushes
    the image and creates the Secret first, and its install renders with both."""
    readme = (CHART / "README.md").read_text()
    secret = _command(readme, "kubectl -n tempered create secret generic")
    install = _command(readme, "helm install tempered charts/tempered")
    installed_at = readme.index("helm install tempered charts/tempered")
    assert readme.index("kubectl -n tempered create secret generic") < installed_at
    assert "docker push" in readme[:installed_at]
    secret_name = secret.split()[6]
    sets = re.findall(r"--set\s+(\S+)", install)
    assert f"s3.existingSecret={secret_name}" in sets
    for key in ("TEMPERED_S3__ACCESS_KEY", "TEMPERED_S3__SECRET_KEY"):
        assert f"--from-literal={key}=" in secret
    rendered = helm_run(
        "template",
        "tempered",
        str(CHART),
        "--namespace",
        "tempered",
        *(arg for value in sets for arg in ("--set", value)),
    )
    deployments = [
        doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "Deployment"
    ]
    assert len(deployments) == 5
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "REGISTRY/tempered:cuda"
        assert {"secretRef": {"name": secret_name}} in container["envFrom"]
