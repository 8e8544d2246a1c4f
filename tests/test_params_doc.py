"""Every parameter has a rank and a doc; ``--list`` groups them by rank; the scheme
pages' parameter tables (docs/schemes/<name>.md) equal what params_doc.py generates
from the declarations, so the defaults live in one place."""
import os
import subprocess
import sys

import pytest

import kvstore_ext
from kvstore_ext import params_doc
from kvstore_ext.params import RANKS
from kvstore_ext.schemes.base import COMMON_PARAMS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, 'docs')


def test_every_parameter_has_a_rank_and_a_doc():
    for name, scheme in kvstore_ext.SCHEMES.items():
        for pname, p in dict(scheme.PARAMS, **COMMON_PARAMS).items():
            assert p.rank in RANKS, (name, pname)
            assert len(p.doc) >= 30, (name, pname, p.doc)


def test_a_scheme_with_knobs_ranks_one_worth_tuning():
    """Every scheme with parameters of its own says which to tune first."""
    for name, scheme in kvstore_ext.SCHEMES.items():
        if scheme.PARAMS and name not in ('fp16',):
            assert any(p.rank == 'tune' for p in scheme.PARAMS.values()), name


@pytest.mark.parametrize('name', sorted(kvstore_ext.SCHEMES))
def test_committed_page_equals_the_generated_table(name):
    path = params_doc.page_path(DOCS, name)
    with open(path) as f:
        text = f.read()
    want = params_doc.rewrite(text, params_doc.table(kvstore_ext.SCHEMES[name]), path)
    assert text == want, ('%s: its parameter table differs from the declarations; run '
                          'python -m kvstore_ext.params_doc' % path)


def test_the_check_names_a_stale_page(tmp_path):
    schemes = tmp_path / 'schemes'
    schemes.mkdir()
    for name in kvstore_ext.SCHEMES:
        text = open(params_doc.page_path(DOCS, name)).read()
        (schemes / ('%s.md' % name)).write_text(text)
    assert params_doc.main(['--docs', str(tmp_path), '--check']) == 0
    page = schemes / 'hylo.md'
    page.write_text(page.read_text().replace('`0.3`', '`0.5`'))
    assert params_doc.main(['--docs', str(tmp_path), '--check']) == 1
    assert params_doc.main(['--docs', str(tmp_path)]) == 0           # rewrites it
    assert params_doc.main(['--docs', str(tmp_path), '--check']) == 0


def run_list(*extra):
    return subprocess.run([sys.executable, '-m', 'kvstore_ext', '--list'] + list(extra),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120, check=True).stdout


def test_list_groups_by_rank():
    out = run_list()
    hylo = out[out.index('dist_sync_hylo:'):]
    hylo = hylo[:hylo.index('\n\n')]
    tune, leave = hylo.index('[tune]'), hylo.index('[leave]')
    expert, removed = hylo.index('[expert]'), hylo.index('[removed]')
    assert tune < hylo.index('conv_rate_max') < hylo.index('fc_scale') < leave
    assert leave < hylo.index('aggregation') < expert < hylo.index('fc_threshold') < removed
    assert "momentum_masking='on'" in hylo[removed:] and 'fc_value' in hylo[removed:]


def test_list_markdown_prints_the_pages_tables():
    out = run_list('--markdown')
    for name, scheme in kvstore_ext.SCHEMES.items():
        assert params_doc.table(scheme) in out, name
