# Every target sets itself up: a .venv in the repo with the pinned packages, then the
# package with its C++ plugin built by CMake (scikit-build-core) against that MXNet.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
DEPS   := $(VENV)/.deps-installed
CTEST_BUILD := build/ctest

.PHONY: venv install demo test test-cpp test-py bench results-page clean

venv: $(DEPS)

$(DEPS): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements.txt
	touch $@

# Non-editable install: servers started by the launcher import the installed package.
install: $(DEPS)
	$(PIP) install -q --no-build-isolation --no-deps .

demo: install
	$(PY) -m kvstore_ext.launch -n 2 -s 1 --timeout 600 -- \
	    $(PY) gluon_scripts/train_mnist.py --kvstore dist_sync_hylo --num-epochs 6 \
	    --batch-size 32 --lr 0.1 --log-interval 0

test-cpp:
	cmake -S . -B $(CTEST_BUILD) -DKVX_BUILD_TESTS=ON -DKVX_BUILD_PLUGIN=OFF >/dev/null
	cmake --build $(CTEST_BUILD) -j2
	cd $(CTEST_BUILD) && ctest --output-on-failure

test-py: install
	$(VENV)/bin/pytest -q -rs tests

test: test-cpp test-py

bench: install
	PYTHON=$(abspath $(PY)) bash bench/run_all.sh

# docs/RESULTS.md from the files in bench/results/ (standard library only, no MXNet)
results-page:
	$(PYTHON) bench/results_page.py

clean:
	rm -rf build $(VENV)
