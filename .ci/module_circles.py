#!/usr/bin/env python3
"""Import circles between the modules of each crate of the workspace.

A module is a file's path under `src/` to two levels (`ext_proc::picker`),
an edge a `crate::module` path or, inside a folder module, a
`super::sibling` path (unit tests excluded). Prints each crate with its
circles and exits 1 if any crate has one. Crates cannot depend on each
other in a circle (cargo refuses), so modules are what is left to check.
Usage: module_circles.py [workspace root]
"""
import os, re, sys
def crates(root):
    for dp,dn,fn in os.walk(root):
        if 'target' in dp or '/.git' in dp: continue
        if 'Cargo.toml' in fn and os.path.isdir(os.path.join(dp,'src')):
            yield dp
def modname(src,path):
    rel=os.path.relpath(path,src)[:-3].split('/')
    if rel[-1] in ('mod','lib','main'): rel=rel[:-1]
    return rel
def graph(crate):
    src=os.path.join(crate,'src'); edges={}
    for dp,dn,fn in os.walk(src):
        for f in fn:
            if not f.endswith('.rs'): continue
            p=os.path.join(dp,f); m=modname(src,p)
            if m and m[0]=='bin': continue
            if 'tests' in m: continue
            node='::'.join(m[:2]) if m else 'lib'
            text=open(p).read()
            text=re.sub(r'#\[cfg\(test\)\]\s*mod tests\s*\{.*','',text,flags=re.S)
            refs=set(re.findall(r'crate::([a-z_]+)(?:::([a-z_]+))?',text))
            if len(m)==2:
                for sib in set(re.findall(r'super::([a-z_]+)',text)):
                    refs.add((m[0],sib))
            # super:: from a file in a folder module refers to the parent
            for a,b in refs:
                tgt=a+('::'+b if b and os.path.isdir(os.path.join(src,a)) else '')
                if not tgt.startswith(node) and not node.startswith(tgt):
                    edges.setdefault(node,set()).add(tgt)
    return edges
def cycles(edges):
    found=[]; idx={}; low={}; st=[]; on=set(); c=[0]
    def sc(v):
        idx[v]=low[v]=c[0]; c[0]+=1; st.append(v); on.add(v)
        for w in edges.get(v,()):
            if w not in idx: sc(w); low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],idx[w])
        if low[v]==idx[v]:
            comp=[]
            while True:
                w=st.pop(); on.discard(w); comp.append(w)
                if w==v: break
            if len(comp)>1: found.append(sorted(comp))
    for v in list(edges): 
        if v not in idx: sc(v)
    return found
root = sys.argv[1] if len(sys.argv) > 1 else "."
bad = 0
for c in sorted(crates(root)):
    cyc = cycles(graph(c))
    bad += len(cyc)
    print(f"{os.path.relpath(c, root)}: {'no circles' if not cyc else cyc}")
sys.exit(1 if bad else 0)
