"""scripts/publish.sh OWNER/NAME [BRANCH], on a copy of the repository's files: it points the Colab
badge (notebook and README) and the install cell's HELPERS_URL at the repository, again after an
earlier publish, changes nothing else, and refuses what is not an OWNER/NAME or a branch."""
import json
import shutil
import subprocess

import pytest

from conftest import ROOT

NOTEBOOK = "Unsloth_Puzzles_NF4.ipynb"


@pytest.fixture
def repo(tmp_path):
    for path in (NOTEBOOK, "README.md", "scripts/publish.sh", "scripts/publish.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def publish(repo, *args):
    return subprocess.run(["bash", str(repo / "scripts" / "publish.sh"), *args], capture_output=True, text=True,
                          timeout=60)


def badge(owner, name, branch):
    return f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/{NOTEBOOK}"


def helpers_url(owner, name, branch):
    return f"https://raw.githubusercontent.com/{owner}/{name}/{branch}/helpers.py"


def cells(repo):
    notebook = json.loads((repo / NOTEBOOK).read_text())
    first_markdown = next(c for c in notebook["cells"] if c["cell_type"] == "markdown")
    install = next(c for c in notebook["cells"] if "".join(c["source"]).startswith("# @title Install"))
    return notebook, first_markdown, install


def changed_lines(before, after):
    a, b = before.splitlines(), after.splitlines()
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b) if x != y]


def assert_published(repo, owner, name, branch):
    _, first_markdown, install = cells(repo)
    assert f'<a href="{badge(owner, name, branch)}" target="_parent">' in "".join(first_markdown["source"])
    assert f'"NF4_HELPERS_URL", "{helpers_url(owner, name, branch)}")' in "".join(install["source"])
    assert f"]({badge(owner, name, branch)})" in (repo / "README.md").read_text()


@pytest.mark.parametrize("branch", [None, "release/v1.2"])
def test_publish_rewrites_the_badge_and_helpers_url_and_nothing_else(repo, branch):
    notebook_before, readme_before = (repo / NOTEBOOK).read_text(), (repo / "README.md").read_text()
    result = publish(repo, "octo-cat/nf4.triton_x", *([branch] if branch else []))
    assert result.returncode == 0, result.stderr
    assert_published(repo, "octo-cat", "nf4.triton_x", branch or "main")
    assert "git push" in result.stdout
    # one line of the notebook's file per rewritten URL, one of the README
    assert len(changed_lines(notebook_before, (repo / NOTEBOOK).read_text())) == 2
    assert len(changed_lines(readme_before, (repo / "README.md").read_text())) == 1
    before, after = json.loads(notebook_before), json.loads((repo / NOTEBOOK).read_text())
    rewritten = {next(i for i, c in enumerate(after["cells"]) if c["cell_type"] == "markdown"),
                 next(i for i, c in enumerate(after["cells"]) if "".join(c["source"]).startswith("# @title Install"))}
    assert len(after["cells"]) == len(before["cells"])
    assert ([c for i, c in enumerate(after["cells"]) if i not in rewritten]
            == [c for i, c in enumerate(before["cells"]) if i not in rewritten])
    assert after["metadata"] == before["metadata"]


def test_publish_again_replaces_an_earlier_publish(repo):
    assert publish(repo, "alice/first", "dev").returncode == 0
    once = (repo / NOTEBOOK).read_text(), (repo / "README.md").read_text()
    result = publish(repo, "bob/second")
    assert result.returncode == 0, result.stderr
    assert_published(repo, "bob", "second", "main")
    assert "alice" not in (repo / NOTEBOOK).read_text() + (repo / "README.md").read_text()
    assert publish(repo, "alice/first", "dev").returncode == 0
    assert ((repo / NOTEBOOK).read_text(), (repo / "README.md").read_text()) == once


def test_the_repository_itself_holds_a_url_publish_can_rewrite(repo):
    # whatever the committed notebook holds (the placeholder or a publish), the patterns find it
    assert publish(repo, "someone/something").returncode == 0
    assert_published(repo, "someone", "something", "main")


@pytest.mark.parametrize("args", [
    [], ["octocat"], ["octocat/"], ["/nf4"], ["octocat/nf4/extra"], ["-octocat/nf4"], ["octo--cat/nf4"],
    ["octocat/nf4 x"], ["octocat/.."], ["octocat/nf4.git"], ["a" * 40 + "/nf4"], ["octocat/nf4", "bad branch"],
    ["octocat/nf4", "a..b"], ["octocat/nf4", "-b"], ["octocat/nf4", "x.lock"], ["octocat/nf4", "a//b"],
    ["octocat/nf4", "'quote"], ["octocat/nf4", "main", "extra"],
])
def test_publish_refuses_what_is_not_owner_name_and_branch(repo, args):
    before = (repo / NOTEBOOK).read_bytes(), (repo / "README.md").read_bytes()
    result = publish(repo, *args)
    assert result.returncode != 0
    assert result.stderr.strip().startswith(("publish:", "usage:")), result.stderr
    assert ((repo / NOTEBOOK).read_bytes(), (repo / "README.md").read_bytes()) == before


def test_publish_refuses_a_notebook_without_a_url_to_rewrite(repo):
    notebook = json.loads((repo / NOTEBOOK).read_text())
    _, _, install = cells(repo)
    index = next(i for i, c in enumerate(notebook["cells"]) if c["source"] == install["source"])
    notebook["cells"][index]["source"] = ["# @title Install\n", "HELPERS_URL = None\n"]
    (repo / NOTEBOOK).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    before = (repo / NOTEBOOK).read_bytes(), (repo / "README.md").read_bytes()
    result = publish(repo, "octocat/nf4")
    assert result.returncode != 0 and "no URL to rewrite in the install cell" in result.stderr
    assert ((repo / NOTEBOOK).read_bytes(), (repo / "README.md").read_bytes()) == before
