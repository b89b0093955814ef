#!/usr/bin/env python3
"""Checks the relative links of the Markdown pages: every [text](path#anchor) in README.md,
CONTRIBUTING.md and docs/*.md must name an existing file and, with an anchor, a heading of that
file (GitHub's anchor rules: lower case, punctuation dropped, spaces as hyphens, "-1", "-2" for
repeated headings). With --code it also checks the "docs/<page>.md#anchor" references in
src/, include/, tests/ and scripts/. Exits 1 listing each broken link.

    python3 scripts/check_doc_links.py [--code]
"""
import os
import re
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip())
    text = text.lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path):
    found, counts, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                n = counts.get(base, 0)
                counts[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
    return found


def pages():
    names = ["README.md", "CONTRIBUTING.md"]
    names += [os.path.join("docs", n) for n in sorted(os.listdir(os.path.join(ROOT, "docs")))
              if n.endswith(".md")]
    return [n for n in names if os.path.exists(os.path.join(ROOT, n))]


CODE_REF = re.compile(r"((?:docs/)?[A-Za-z_]+\.md)#([A-Za-z0-9_\-]+)")


def code_refs(cache):
    broken, checked = [], 0
    for top in ("src", "include", "tests", "scripts"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                path = os.path.join(folder, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        lines = f.readlines()
                except (UnicodeDecodeError, OSError):
                    continue
                for number, line in enumerate(lines, 1):
                    for page, anchor in CODE_REF.findall(line):
                        if not page.startswith("docs/") and page not in ("README.md",
                                                                         "CONTRIBUTING.md"):
                            page = "docs/" + page
                        target = os.path.join(ROOT, page)
                        if not os.path.exists(target):
                            continue
                        checked += 1
                        if target not in cache:
                            cache[target] = anchors(target)
                        if anchor not in cache[target]:
                            broken.append(f"{os.path.relpath(path, ROOT)}:{number}: "
                                          f"{page}#{anchor}: no such heading")
    return broken, checked


def main():
    broken, checked, cache = [], 0, {}
    for page in pages():
        fenced = False
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.lstrip().startswith("```"):
                    fenced = not fenced
                    continue
                if fenced:
                    continue
                for target in LINK.findall(line):
                    if re.match(r"[a-z]+:", target):
                        continue  # http:, https:, mailto:
                    checked += 1
                    file_part, _, anchor = target.partition("#")
                    here = os.path.dirname(os.path.join(ROOT, page))
                    path = os.path.normpath(os.path.join(here, file_part)) if file_part else \
                        os.path.join(ROOT, page)
                    if not os.path.exists(path):
                        broken.append(f"{page}:{number}: {target}: no file {file_part}")
                        continue
                    if anchor and path.endswith(".md"):
                        if path not in cache:
                            cache[path] = anchors(path)
                        if anchor not in cache[path]:
                            broken.append(f"{page}:{number}: {target}: no heading #{anchor} "
                                          f"in {os.path.relpath(path, ROOT)}")
    if "--code" in sys.argv[1:]:
        more, count = code_refs(cache)
        broken += more
        checked += count
    for b in broken:
        print(b)
    print(f"{checked} links checked, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
