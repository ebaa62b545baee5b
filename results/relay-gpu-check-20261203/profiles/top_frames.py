import sys, collections
for f in sys.argv[1:]:
    self_c = collections.Counter(); incl = collections.Counter(); total = 0
    for line in open(f):
        line = line.rstrip()
        if not line: continue
        stack, n = line.rsplit(" ", 1); n = int(n); total += n
        frames = stack.split(";")
        self_c[frames[-1]] += n
        for fr in set(frames): incl[fr] += n
    print(f"== {f}: {total} samples")
    print("-- self"); [print(f"{100*c/total:5.1f}% {fr[:150]}") for fr, c in self_c.most_common(25)]
    print("-- inclusive"); [print(f"{100*c/total:5.1f}% {fr[:150]}") for fr, c in incl.most_common(45)]
