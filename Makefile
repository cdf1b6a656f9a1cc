# make demo: install what is missing, start a throwaway MariaDB, create the schema and grants as its owner (init-db),
# run the batch job on demo reviews as the least-privilege job account.
# make test: install what is missing, then ruff, mypy and pytest (tests start their own MariaDB).
SHELL := /bin/bash
PY      := .venv/bin/python
VENV_OK := .venv/.installed
export PYSPARK_PYTHON := $(CURDIR)/.venv/bin/python
export SPARK_LOCAL_IP := 127.0.0.1
export QWENSPARK_CACHE := $(CURDIR)/.cache
JAR     := /usr/share/java/mariadb-java-client.jar
# Library chatter hidden from the demo's console (it stays in .run/demo-job.log).
NOISE   := ^\(|^\[W|^WARNING|^Using Spark|^Setting default|^To adjust|^[0-9/]+ [0-9:]+ (WARN|INFO)|Warning|warn\(|wrapper = |if hasattr|^Loading safetensors|^$$|^Triton
APT_PKGS := mariadb-server mariadb-client libmariadb-java

.PHONY: demo stream dashboard serve test deps browser venv db db-stop model lint sql bench clean help

help:
	@echo "make demo   - run the batch job on the demo reviews (installs and starts what it needs)"
	@echo "make stream - run the streaming job on the demo database (Ctrl-C stops it; a restart resumes)"
	@echo "make dashboard - serve the web dashboard on the demo database: http://127.0.0.1:8050"
	@echo "make serve  - analyse reviews on request: POST http://127.0.0.1:8060/v1/analyze (Ctrl-C stops it)"
	@echo "make test   - lint, type-check and run the tests"
	@echo "make sql Q='SELECT ...' - query the demo database;  make db-stop - stop it"

deps:
	@if command -v mariadbd >/dev/null && [ -f $(JAR) ]; then \
	  echo "[deps] MariaDB server, client and JDBC driver: present"; \
	else \
	  echo "[deps] installing Debian packages: $(APT_PKGS)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(APT_PKGS) >/dev/null; \
	fi
	@command -v java >/dev/null || { echo "[deps] Java 17 is required (apt-get install openjdk-17-jre-headless)"; exit 1; }

venv: $(VENV_OK)
$(VENV_OK): pyproject.toml
	@echo "[venv] creating .venv and installing qwenspark[cpu,hf,dev,delta,dashboard,serve] (first time: about 2-3 min, 5 GB)"
	@test -x $(PY) || python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
	@# --no-cache-dir: pip's wheel cache would hold a second copy of what the venv holds (GBs on a full disk).
	@$(PY) -m pip install -q --no-cache-dir --upgrade pip
	@$(PY) -m pip install --no-cache-dir --progress-bar on -e ".[cpu,hf,dev,delta,dashboard,serve]" | grep -E "^(Collecting|Installing|Successfully)" || true
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside CPU torch.
	@$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@$(PY) -c "import vllm, pyspark; print('[venv] vllm', vllm.__version__, '/ pyspark', pyspark.__version__)"
	@touch $@

db: deps
	@scripts/mariadb.sh start

db-stop:
	@scripts/mariadb.sh stop

model: venv
	@echo "[model] default model (Qwen2.5-Coder-0.5B-Instruct): download, verify, convert once into .cache/models"
	@$(PY) -m qwenspark.cli fetch-model --config conf/local.yaml

demo: deps venv db model
	@echo "[demo] schema and grants as the schema owner (qwenspark init-db), then data/demo/hotel_reviews_demo.csv"
	@.venv/bin/qwenspark -q init-db --config conf/local.yaml >/dev/null
	@.venv/bin/qwenspark -q load-reviews --config conf/local.yaml
	@echo "[demo] running the batch job through spark-submit (progress below, a line per 32 reviews; full log: .run/demo-job.log)"
	@echo "[demo] 313 reviews: about 3 min on a 2-core CPU with AVX-512, 12 min on one with AVX2 only (README, Two commands)"
	@set -o pipefail; .venv/bin/spark-submit --master 'local[2]' --jars $(JAR) --conf spark.python.worker.reuse=true \
	  --conf spark.ui.showConsoleProgress=false --driver-java-options -Duser.timezone=UTC jobs/hotel_sentiment.py --config conf/local.yaml \
	  2>&1 | tee .run/demo-job.log | grep --line-buffered -vE '$(NOISE)'
	@echo "[demo] see the results: make dashboard, then open http://127.0.0.1:8050"

dashboard: deps venv db
	@.venv/bin/qwenspark -q init-db --config conf/local.yaml >/dev/null  # the views, and their grant to the dashboard
	@echo "[dashboard] http://127.0.0.1:8050 (read-only account qwenspark_dashboard; Ctrl-C stops it)"
	@.venv/bin/qwenspark -q dashboard --config conf/local.yaml

stream: deps venv db model
	@.venv/bin/qwenspark -q init-db --config conf/local.yaml >/dev/null  # as the schema owner: the job has DML only
	@echo "[stream] streaming job on the demo database: new rows of hotel_reviews are analysed as they land"
	@echo "[stream] try, in another shell: make sql Q=\"INSERT INTO hotel_reviews VALUES (900001, 'H01', UTC_TIMESTAMP(), 'en', 5, 'Lovely staff, noisy street.')\""
	@echo "[stream] Ctrl-C stops it; a restart resumes from .run/checkpoints (full log: .run/stream-job.log)"
	@set -o pipefail; .venv/bin/spark-submit --master 'local[2]' --jars $(JAR) --conf spark.python.worker.reuse=true \
	  --conf spark.ui.showConsoleProgress=false --driver-java-options -Duser.timezone=UTC jobs/hotel_sentiment_stream.py \
	  --config conf/local.yaml 2>&1 | tee .run/stream-job.log | grep --line-buffered -vE '$(NOISE)'

serve: venv model
	@echo "[serve] http://127.0.0.1:8060  try: curl -s localhost:8060/v1/analyze -d '{\"text\": \"Lovely staff, noisy street.\"}'"
	@echo "[serve] label first: add ?stream=true; metrics: /metrics; Ctrl-C stops it"
	@.venv/bin/qwenspark -q serve --config conf/local.yaml

sql: db
	@scripts/mariadb.sh sql qwenspark --table -e "$(Q)"

lint: venv
	@echo "[lint] ruff + mypy"
	@.venv/bin/ruff check qwenspark tests bench jobs dags
	@.venv/bin/mypy qwenspark

# The dashboard's browser tests drive Debian's chromium (Playwright brings no browser here) with a CJK font.
BROWSER_PKGS := chromium fonts-wqy-microhei
browser:
	@if command -v chromium >/dev/null && fc-list 2>/dev/null | grep -qi "WenQuanYi Micro Hei"; then \
	  echo "[browser] chromium and a CJK font: present"; \
	else \
	  echo "[browser] installing Debian packages: $(BROWSER_PKGS)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(BROWSER_PKGS) >/dev/null; \
	fi

test: deps venv browser lint
	@echo "[test] pytest (starts its own MariaDB on a free 127.0.0.1 port, local Spark, Airflow in .venv-airflow; fetches the default model once)"
	@.venv/bin/python -m pytest -q tests

bench: deps venv
	@$(PY) bench/bench_jdbc.py

clean: db-stop
	rm -rf .run .venv-airflow .cache/vllm .cache/torchinductor spark-warehouse metastore_db
