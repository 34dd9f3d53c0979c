#!/usr/bin/env python3
"""Plain text of the PostgreSQL manual's HTML pages, in book order.

usage: html2text.py HTML_DIR OUT.txt

Starts at index.html and follows each page's <link rel="next">, so the text
reads as the book does.  Per page: the navigation header and footer
(div.navheader, div.navfooter) are dropped; block elements (p, div, h1-h6,
li, tr, pre, dt, dd, br, table) end a line; inside <pre> whitespace is kept,
elsewhere runs of spaces and newlines collapse to one space; entities are
decoded; lines are stripped of trailing spaces and runs of blank lines
collapse to one.  Uses only the standard library.
"""
import html.parser
import os
import re
import sys

BLOCK = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "tr", "pre", "dt", "dd", "br",
         "table", "blockquote"}


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip = 0          # depth inside a navigation div
        self.div_stack = []    # True for the divs that opened a skip
        self.pre = 0
        self.next = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "link" and a.get("rel") == "next":
            self.next = a.get("href")
        if tag == "div":
            nav = a.get("class") in ("navheader", "navfooter")
            self.div_stack.append(nav)
            self.skip += nav
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK and not self.skip:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag == "div" and self.div_stack:
            self.skip -= self.div_stack.pop()
        if tag == "pre":
            self.pre -= 1
        if tag in BLOCK and not self.skip:
            self.out.append("\n")

    def handle_data(self, data):
        if self.skip:
            return
        if not self.pre:
            data = re.sub(r"\s+", " ", data)
        self.out.append(data)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    seen = set()
    name = "index.html"
    pages = []
    while name and name not in seen and os.path.exists(os.path.join(src, name)):
        seen.add(name)
        p = Page()
        with open(os.path.join(src, name), encoding="utf-8") as f:
            p.feed(f.read())
        pages.append("".join(p.out))
        name = p.next
    text = "\n".join(pages)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(l.rstrip() for l in text.split("\n")))
    with open(dst, "w", encoding="utf-8") as f:
        f.write(text.strip() + "\n")
    print(f"{len(pages)} pages, {len(text)} characters -> {dst}")


if __name__ == "__main__":
    main()
