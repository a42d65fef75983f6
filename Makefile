# ms-port: `make demo` sets everything up and runs the main job; `make test` runs the suite.
# Both create the environment (.venv) from nothing when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   := demo

.PHONY: env demo test test-fast lint bench fuzz clean

env: $(STAMP)

# mindformers 2.1.0 declares mindspore~=2.11.0 and hyper-parallel (not on PyPI), so it is
# installed on its own with --no-deps; the `llm` extra brings the modules it imports.
# ultralytics (AGPL-3.0, the detection tests' reference) likewise: its opencv-python needs
# numpy 2; the `yolo` extra's headless OpenCV serves it.
# setuptools' build of the editable install warns, in 9 lines, of folders named like the
# package in the working directory (its "Editable installation." notice): silenced by
# that message only, in pip's build environment.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=23"
	PYTHONWARNINGS="ignore:Editable installation" \
	  $(PY) -m pip install --quiet -c constraints.txt -e ".[torchvision,dev,zoo,llm,hub,yolo]"
	$(PY) -m pip install --quiet --no-deps -c constraints.txt mindformers==2.1.0 mindpet==1.0.4 rouge-chinese==1.0.3
	$(PY) -m pip install --quiet --no-deps -c constraints.txt ultralytics
	touch $(STAMP)

demo: env
	$(PY) examples/make_default_checkpoint.py $(DEMO)/resnet50.pth
	$(VENV)/bin/ms-port inspect $(DEMO)/resnet50.pth --limit 12
	$(VENV)/bin/ms-port convert $(DEMO)/resnet50.pth --arch resnet50 -o $(DEMO)/resnet50.ckpt --force
	$(VENV)/bin/ms-port verify $(DEMO)/resnet50.pth $(DEMO)/resnet50.ckpt --arch resnet50 --tol 1e-5

# two workers (pytest-xdist): the suite on this project's 2-core machines takes 17 min
# rather than 27; TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
test: env lint
	$(PY) -m pytest -q -n $(TEST_WORKERS)

test-fast: env
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow"

lint: env
	$(VENV)/bin/ruff check ms_port tests examples benchmarks

# the long differential-fuzzing run (our PyTorch reader vs torch.load(weights_only=True))
fuzz: env
	FUZZ_CASES=2000 $(PY) -m pytest -q tests/test_fuzz_differential.py

# the default cases, then the 1.1B bfloat16 LLaMA against cp and MindFormers (~13 GiB disk)
bench: env
	$(PY) benchmarks/run.py --cases resnet50,synth-1g,synth-3g,help,inspect,verify,verify-vgg16,llm-1b

clean:
	rm -rf $(VENV) $(DEMO) build dist *.egg-info
