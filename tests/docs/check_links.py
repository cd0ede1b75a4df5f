#!/usr/bin/env python3
"""The docs stand alone: README.md and docs/*.md link only to files of the repository
(no absolute paths, nothing above its root), each of those exists, a link to a heading
(#anchor) names a heading of that page as GitHub makes anchors from headings, and no
page names ../shared or a /work/ path. Web links (http, https, mailto) are not followed.

    check_links.py REPO_ROOT
"""
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
# Paths of the machine the docs were written on, never the reader's.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w.])/work/\S*")


def prose(text):
    """The lines outside fenced code blocks, with inline code spans blanked."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return out


def anchors(path):
    """GitHub's anchors for the headings of a Markdown file."""
    seen, result = {}, set()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    fenced = False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = m.group(2).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", slug)  # drops punctuation and backticks, keeps _ and -
        slug = slug.replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f"{slug}-{n}")
    return result


def main():
    root = os.path.realpath(sys.argv[1])
    pages = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    problems, checked = [], 0
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        rel_page = os.path.relpath(page, root)
        for number, line in enumerate(text.split("\n"), 1):
            for outside in OUTSIDE.findall(line):
                problems.append(f"{rel_page}:{number}: names {outside}, outside the repository")
        lines = prose(text)
        for number, line in enumerate(lines, 1):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                checked += 1
                where = f"{rel_page}:{number}: ({target})"
                path, _, anchor = target.partition("#")
                if path.startswith("/"):
                    problems.append(f"{where} is an absolute path")
                    continue
                full = os.path.realpath(os.path.join(os.path.dirname(page), path)) if path else page
                if full != root and not full.startswith(root + os.sep):
                    problems.append(f"{where} points outside the repository")
                    continue
                if not os.path.exists(full):
                    problems.append(f"{where} names a file that does not exist")
                    continue
                if anchor and full.endswith(".md") and anchor not in anchors(full):
                    problems.append(f"{where} names no heading of {os.path.relpath(full, root)}")
    for p in problems:
        print(p)
    print(f"{checked} links checked in {len(pages)} pages: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
