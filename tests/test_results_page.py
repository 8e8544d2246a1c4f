"""docs/RESULTS.md is generated from bench/results/ (bench/results_page.py): the committed
page must be what the generator writes, and every `bench/results/<file>` a document or
the code names must exist, so that renaming or removing a result file cannot leave a
dangling citation. Standard library only: no MXNet, no processes but the generator."""
import glob
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = os.path.join(REPO, 'bench', 'results_page.py')
# where a citation of a result file may live (the result files themselves are data:
# their notes name the files they were paired with when they were made)
SCAN = ['README.md', 'docs', 'kvstore_ext', 'bench', 'tests']
SUFFIXES = ('.md', '.py', '.sh', '.txt', '.cc', '.h', '.cfg', '.toml')
CITATION = re.compile(r'bench/results/([A-Za-z0-9_.{},*\-]+[A-Za-z0-9}*])')


def _generate(*args):
    return subprocess.run([sys.executable, GENERATOR] + list(args), cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_committed_page_is_the_generated_one():
    result = _generate('--check')
    assert result.returncode == 0, result.stderr


def test_check_fails_on_a_page_that_differs(tmp_path):
    page = tmp_path / 'RESULTS.md'
    with open(os.path.join(REPO, 'docs', 'RESULTS.md')) as f:
        text = f.read()
    page.write_text(text.replace('24 of 24', '23 of 24', 1) if '24 of 24' in text
                    else text + 'edited\n')
    result = _generate('--check', '--out', str(page))
    assert result.returncode == 1
    assert 'make results-page' in result.stderr


def _files():
    for top in SCAN:
        path = os.path.join(REPO, top)
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, names in os.walk(path):
            rel = os.path.relpath(root, REPO)
            if rel == os.path.join('bench', 'results') or '__pycache__' in rel:
                dirs[:] = []
                continue
            for name in names:
                if name.endswith(SUFFIXES):
                    yield os.path.join(root, name)


def _expand(pattern):
    """`kernels.{json,png}` -> both names; globs (`exit_repeat*.json`) must match one."""
    m = re.search(r'\{([^{}]*)\}', pattern)
    if m:
        return [n for alt in m.group(1).split(',')
                for n in _expand(pattern[:m.start()] + alt + pattern[m.end():])]
    return [pattern]


def test_every_cited_result_file_exists():
    results = os.path.join(REPO, 'bench', 'results')
    missing = []
    for path in _files():
        with open(path, errors='replace') as f:
            text = f.read()
        for m in CITATION.finditer(text):
            for name in _expand(m.group(1).rstrip('.')):
                if not glob.glob(os.path.join(results, name)):
                    line = text.count('\n', 0, m.start()) + 1
                    missing.append('%s:%d: bench/results/%s'
                                   % (os.path.relpath(path, REPO), line, name))
    assert not missing, 'cited result files that do not exist:\n' + '\n'.join(missing)


def _edit_block_and_check(path, pattern, replacement, flag):
    """Hand-edit the generated block of ``path`` (a copy) by ``pattern``: the check
    (given ``flag`` pointing at the copy) fails naming the file, and the generator
    restores it byte for byte."""
    text = path.read_text()
    block = text[text.index('<!-- defaults:begin -->'):text.index('<!-- defaults:end -->')]
    edited = re.sub(pattern, replacement, block, count=1)
    assert edited != block
    path.write_text(text.replace(block, edited))
    result = _generate('--check', *flag)
    assert result.returncode == 1
    assert path.name in result.stderr and 'make results-page' in result.stderr
    assert _generate(*flag).returncode == 0       # rewrites it
    assert path.read_text() == text


def test_check_fails_on_a_scheme_page_whose_numbers_differ(tmp_path):
    """The scheme pages' numbers at the defaults are the generator's too: a hand edit of
    one (here Hylo's test accuracy) fails the check, naming the page."""
    schemes = tmp_path / 'schemes'
    shutil.copytree(os.path.join(REPO, 'docs', 'schemes'), str(schemes))
    _edit_block_and_check(schemes / 'hylo.md', r'\d+\.\d\d ±', '99.99 ±',
                          ['--schemes', str(schemes)])


def test_check_fails_on_a_readme_whose_table_differs(tmp_path):
    """README's first-screen table is generated from the same files: a hand edit of its
    bytes fails the check, naming README, and the generator restores it."""
    readme = tmp_path / 'README.md'
    shutil.copy(os.path.join(REPO, 'README.md'), str(readme))
    _edit_block_and_check(readme, r'\(\d+\.\dx fewer\)', '(9.9x fewer)',
                          ['--readme', str(readme)])


def _results_page():
    import importlib.util
    spec = importlib.util.spec_from_file_location('results_page_under_test', GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell_runs(page, cell, today_shift):
    """Paired runs of one matrix cell: 6 earlier seeds, 4 of today's (its RECHECK file),
    today's Hylo losses moved by ``today_shift`` points."""
    model, workers, schedule = cell
    runs = []
    for seed in range(1, 11):
        today = seed > 6
        name = page.recheck_file(cell) if today else 'earlier.json'
        base = 0.95 + 0.001 * (seed % 3)
        loss = 0.002 * ((seed * 7) % 5) + (today_shift / 100.0 if today else 0.0)
        for spec, acc in (('dist_sync', base), (page.SERVER, base - loss),
                          (page.HOMOMORPHIC, base - loss)):
            runs.append({'model': model, 'workers': workers, 'schedule': schedule,
                         'seed': seed, 'spec': spec, 'final_acc': acc, 'file': name})
    return runs


def test_recheck_flags_todays_seeds_only_when_they_moved():
    page = _results_page()
    cell = page.MATRIX[0][0]
    rows, differ, compared = page.recheck_rows(_cell_runs(page, cell, today_shift=0.0))
    assert (differ, compared) == (0, 2)
    assert rows[0][3] == 4 and rows[0][5] == 6          # today's seeds, earlier seeds
    rows, differ, compared = page.recheck_rows(_cell_runs(page, cell, today_shift=1.5))
    assert (differ, compared) == (2, 2)
    assert 'differs' in rows[0][7] and rows[0][7].startswith('+1.50')
