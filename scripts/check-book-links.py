#!/usr/bin/env python3
"""Checks every link of the built manual (mdbook build docs -> target/book).

    check-book-links.py [--book target/book] [--src docs]

A link inside the book must reach a page (or file) of the built book, and its
#fragment an id on that page. A link that leaves the book (`../deploy/...`,
`../BENCHMARKS.md`) must name a file or folder of the repository, resolved from the
chapter's source in docs/, and a #fragment there one of that Markdown file's
headings. External links (http:, https:, mailto:) are not fetched. Prints each broken
link with its page and ends with 'N passed, M failed'; exits 1 on any failure.
"""
import argparse
import html
import os
import re
import sys
from html.parser import HTMLParser
from urllib.parse import unquote


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for k in ("href", "src"):
            if a.get(k) is not None and tag in ("a", "img", "link", "script"):
                self.links.append(a[k])


def parse(path):
    p = Page()
    p.feed(open(path, encoding="utf-8").read())
    return p


def github_slugs(md_path):
    """The anchors GitHub gives a Markdown file's headings."""
    slugs, in_code = set(), False
    for line in open(md_path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"#{1,6} +(.*)", line)
        if m and not in_code:
            t = m.group(1).strip().lower().replace("`", "")
            slugs.add(re.sub(r"[^\w\- ]", "", t).replace(" ", "-"))
    return slugs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--book", default="target/book")
    ap.add_argument("--src", default="docs")
    args = ap.parse_args()
    book, src = os.path.abspath(args.book), os.path.abspath(args.src)
    repo = os.path.dirname(src)
    # Pages made from chapters; print.html repeats them all, toc.html and 404.html
    # are mdbook's own.
    pages = []
    for root, _, files in os.walk(book):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), book)
            if f.endswith(".html") and rel not in ("print.html", "toc.html", "404.html"):
                if os.path.exists(os.path.join(src, rel[: -len(".html")] + ".md")) or rel == "index.html":
                    pages.append(rel)
    if not pages:
        print(f"no pages under {book}: run `mdbook build docs` first")
        return 1
    ids = {}
    passed, failed = 0, []
    for rel in sorted(pages):
        page = parse(os.path.join(book, rel))
        here = os.path.dirname(rel)
        for link in page.links:
            link = html.unescape(link)
            if re.match(r"^[a-z]+:", link) or link.startswith("//"):
                continue  # external, not fetched
            path, _, frag = link.partition("#")
            path, frag = unquote(path), unquote(frag)
            if not path:
                target = rel
            else:
                target = os.path.normpath(os.path.join(here, path))
            full = os.path.join(book, target)
            if not target.startswith("..") and os.path.exists(full):
                if frag and target.endswith(".html"):
                    if target not in ids:
                        ids[target] = parse(full).ids
                    if frag not in ids[target]:
                        failed.append(f"{rel}: {link}: no id '{frag}' on {target}")
                        continue
                passed += 1
                continue
            # Leaves the book: a file of the repository, from the chapter's source.
            source = os.path.normpath(os.path.join(src, here, path))
            candidates = [source]
            if source.endswith(".html"):
                candidates.insert(0, source[: -len(".html")] + ".md")
            found = next((c for c in candidates if os.path.exists(c)), None)
            if not found or not found.startswith(repo + os.sep):
                failed.append(f"{rel}: {link}: neither a page of the book nor a file of the repository")
                continue
            if frag and found.endswith(".md") and frag not in github_slugs(found):
                failed.append(f"{rel}: {link}: no heading '{frag}' in {os.path.relpath(found, repo)}")
                continue
            passed += 1
    for f in failed:
        print("FAIL", f)
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
