#!/bin/bash
python3 -c '
names = [n for n in open("names.txt").read().split("\n") if n.strip()]
names.sort(key=lambda n: (n.split()[-1].lower(), n.split()[0].lower()))
open("sorted.txt", "w").write("\n".join(names) + "\n")
'
