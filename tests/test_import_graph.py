"""kvstore_ext's modules import each other without a cycle, and each imports on its own.

Why: a cycle (two modules that need each other, often hidden in a function-level
import) makes the order of imports matter, breaks in a server process where
``mxnet`` is only partly imported, and means neither module can be read or changed
alone. The graph counts every import, at module level or inside a function, of a
module of the package; a package's implicit import of its parent ``__init__`` is not
an edge (Python runs it first, whoever imports).
"""
import ast
import os
import subprocess
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       'kvstore_ext')


def _modules():
    """{dotted name: path} of every module of the package."""
    found = {}
    root = os.path.dirname(PACKAGE)
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, '.')
                if dotted.endswith('.__init__'):
                    dotted = dotted[:-len('.__init__')]
                found[dotted] = path
    return found


def _imports(name, path, modules):
    """The package's modules that ``name`` imports anywhere in its file."""
    package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split('.')
                parts = parts[:len(parts) - node.level + 1]
                target = '.'.join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ''
            for alias in node.names:
                if target + '.' + alias.name in modules:
                    out.add(target + '.' + alias.name)
                elif target in modules:
                    out.add(target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
    out.discard(name)
    return out


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    modules = _modules()
    assert 'kvstore_ext.aggregate' in modules and 'kvstore_ext.codecs.base' in modules
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, '\n'.join(
        'import cycle: ' + ', '.join('%s -> %s' % (m, sorted(graph[m] & set(c))) for m in c)
        for c in cycles)


def test_cycle_finder_finds_one():
    """The check itself: a two-module cycle through a function-level import is found."""
    graph = {'a': {'b'}, 'b': {'a'}, 'c': {'a'}}
    assert _cycles(graph) == [['a', 'b']]


def test_every_module_imports_in_a_fresh_interpreter():
    """Every module imports in a fresh interpreter (one for all of them: one a module
    costs minutes on a loaded machine), in file order, none first by a test's doing."""
    names = sorted(m for m in _modules() if not m.endswith('__main__'))
    code = ('import importlib, sys\n'
            'for name in sys.argv[1:]:\n'
            '    importlib.import_module(name)\n')
    proc = subprocess.run([sys.executable, '-c', code] + names,
                          cwd=os.path.dirname(PACKAGE), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
