"""Point the Colab badge and the notebook's HELPERS_URL at the repository this is published from.

    python3 scripts/publish.py OWNER/NAME [BRANCH]      (scripts/publish.sh is the same)

Rewrites, whatever they held before (the REPO_OWNER/REPO_NAME placeholder or an earlier publish):
- the Colab badge in the notebook's first markdown cell and in README.md:
  https://colab.research.google.com/github/OWNER/NAME/blob/BRANCH/Unsloth_Puzzles_NF4.ipynb
- HELPERS_URL in the notebook's install cell (report.py and model_patch.py are fetched from beside it):
  https://raw.githubusercontent.com/OWNER/NAME/BRANCH/helpers.py
Only those two cells and that README line change; everything else is written back byte for byte.
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_NAME = "Unsloth_Puzzles_NF4.ipynb"
# GitHub's rules: an owner is 1-39 letters, digits or single inner hyphens; a repository name is
# letters, digits, '.', '-' and '_', and not '.' or '..'.
OWNER = re.compile(r"[A-Za-z0-9](?:-?[A-Za-z0-9]){0,38}")
NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
# A branch: git's rules (git check-ref-format --branch) on parts of letters, digits and ._+- only,
# so the URLs need no quoting: no part starts with '.', none ends with '.lock', no '..'.
BRANCH_PART = re.compile(r"(?!\.)(?!.*\.lock$)[A-Za-z0-9._+-]+")
# What a badge or HELPERS_URL holds before the rewrite: any owner, name and branch (branches may
# hold '/'), up to the file the URL names.
BADGE = re.compile(r"https://colab\.research\.google\.com/github/[^/\s\"'()<>]+/[^/\s\"'()<>]+/blob/"
                   r"[^\s\"'()<>]+?/" + re.escape(NOTEBOOK_NAME))
HELPERS = re.compile(r"https://raw\.githubusercontent\.com/[^/\s\"'()<>]+/[^/\s\"'()<>]+/[^\s\"'()<>]+?/helpers\.py")


def parse(repository: str, branch: str) -> tuple[str, str, str]:
    """OWNER/NAME and BRANCH, checked, or SystemExit with what is wrong."""
    owner, _, name = repository.partition("/")
    if not OWNER.fullmatch(owner) or not NAME.fullmatch(name) or name in (".", "..") or name.endswith(".git"):
        raise SystemExit(f"publish: {repository!r} is not a GitHub OWNER/NAME (e.g. octocat/nf4-triton)")
    if (branch.startswith("-") or branch.endswith(".") or ".." in branch
            or not all(BRANCH_PART.fullmatch(part) for part in branch.split("/"))):
        raise SystemExit(f"publish: {branch!r} is not a branch name")
    return owner, name, branch


def rewrite(text: str, pattern: re.Pattern, url: str, where: str) -> str:
    new, count = pattern.subn(url, text)
    if count == 0:
        raise SystemExit(f"publish: no URL to rewrite in {where}")
    return new


def install_cell(cells: list) -> dict:
    code = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).startswith("# @title Install")]
    if len(code) != 1:
        raise SystemExit(f"publish: expected one install cell ('# @title Install ...'), found {len(code)}")
    return code[0]


def publish(root: Path, owner: str, name: str, branch: str) -> list[Path]:
    badge = f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/{NOTEBOOK_NAME}"
    helpers = f"https://raw.githubusercontent.com/{owner}/{name}/{branch}/helpers.py"
    notebook_path, readme_path = root / NOTEBOOK_NAME, root / "README.md"
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    first_markdown = next(c for c in notebook["cells"] if c["cell_type"] == "markdown")
    for cell, pattern, url, where in ((first_markdown, BADGE, badge, "the notebook's first markdown cell"),
                                      (install_cell(notebook["cells"]), HELPERS, helpers, "the install cell")):
        source = rewrite("".join(cell["source"]), pattern, url, where)
        cell["source"] = source.splitlines(keepends=True)
    readme = rewrite(readme_path.read_text(encoding="utf-8"), BADGE, badge, "README.md")
    # the notebook as Jupyter writes it: one-space indent, UTF-8 kept, a final newline
    notebook_path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    readme_path.write_text(readme, encoding="utf-8")
    return [notebook_path, readme_path]


def main(argv: list[str]) -> None:
    if not 1 <= len(argv) <= 2:
        raise SystemExit("usage: scripts/publish.sh OWNER/NAME [BRANCH]   (BRANCH defaults to main)")
    owner, name, branch = parse(argv[0], argv[1] if len(argv) == 2 else "main")
    changed = publish(ROOT, owner, name, branch)
    print(f"published for github.com/{owner}/{name} ({branch}): the Colab badge and HELPERS_URL in "
          f"{', '.join(p.name for p in changed)}. Commit and push them:\n"
          f"  git commit -m 'Publish for {owner}/{name}' {' '.join(p.name for p in changed)} && git push")


if __name__ == "__main__":
    main(sys.argv[1:])
