"""batchserve beside the servers a user would pick instead, in one run on one machine.

Servers: batchserve, LitServe, Mosec, Ray Serve (each with its own dynamic batching set to
the cell's max batch and max wait) and a plain FastAPI endpoint without batching (the
baseline). Each peer runs from its own virtual environment, made by
``bench/peers/setup.py`` (run first, once). Every server serves the same model behind the
same contract (OpenAI ``POST /v1/embeddings``), and the project's open-loop generator
(``batchserve load --json``) drives each in turn with the same schedule.

Scenarios:

1. ``seed``: the Go seed's experiment: 600 requests/s, 250 ms deadline, the synthetic model
   (8 ms per call + 0.25 ms per item, sleeping), max batch 32 with max wait 2 ms and 20 ms,
   and batch 1;
2. ``overload``: 3x and 5x the model's batched capacity (32 / (8 + 32 * 0.25) ms = 2,000/s)
   for 10 s each;
3. ``framework``: a model that returns at once; the rate steps up (x1.5) until p99 exceeds
   50 ms or more than 1% of requests fail, then three bisections (in ratio) between the last
   rate held and the first that failed narrow the gap to about 5%; the highest rate every
   repeat held, and the server's own CPU per request there (every process of it, from
   ``/proc``): where the generator itself falls behind its schedule beside every server,
   the ladder has found the machine's limit rather than a server's, and the CPU per
   request is what still tells the servers apart;
4. ``real``: all-MiniLM-L6-v2 on real paragraphs (Python's reference manual), 32 texts per
   request closed loop and one text per request open loop (past saturation, at half
   capacity): batchserve as ``scripts/serve`` runs it and pinned to torch float32, another
   source tree's batchserve (``--baseline-src``), Infinity on each engine at its best batch
   size, fastembed in process, and ``SentenceTransformer.encode`` on each request's texts
   as the yardstick (:mod:`comparison.real` says how; its contenders are
   ``--real-contenders``, not ``--servers``).

Order of events in a cell: start the server, wait until it answers, warm it up (1 s at a low
rate, discarded), then for each repeat: read its batch counters, run the generator, wait
until the server is idle, read the counters again (their difference gives the run's average
batch, whatever the server), and stop the server. A caller gives up at its deadline (as in
the Go seed), whatever the server does with the request.

Every cell is repeated (``--repeats``, at least 2 for a report); tables show the median of
the repeats, with the range where it matters, and ratios against the best peer. The raw
figures go to ``bench/out/compare-<time>.json``; ``bench/RESULTS.md`` is written from them.

The program, by concept (each module imports the ones before it, nothing after):

* :mod:`comparison.servers`: start, probe and stop each server (its command, its readiness,
  its batch counters and CPU), in a process group of its own;
* :mod:`comparison.generator`: one run of the open-loop generator against a server;
* :mod:`comparison.real`: the ``real`` scenario, with servers and contenders of its own;
* :mod:`comparison.cells`: a cell (a server started, each load run, stopped) and the run's
  record of every cell;
* :mod:`comparison.scenarios`: which cells each scenario runs;
* :mod:`comparison.report`: the report (tables, headline figures, ``bench/RESULTS.md``),
  a pure function of the raw figures;
* :mod:`comparison.cli`: the command line.

Its one entry point is ``bench/peers/compare.py``, run by path from the repository root:
``python bench/peers/compare.py [--scenarios seed,overload,framework,real]
[--servers batchserve,litserve,...] [--repeats 2] [--quick] [--batchserve-flags '--prefetch
off']`` (the last adds flags to every batchserve server: an A/B run of one setting); the
real scenario alone, before and after: ``python bench/peers/compare.py --scenarios real
--baseline-src /tmp/baseline/src``; the report rebuilt from a run's raw figures:
``python bench/peers/compare.py report bench/out/compare-<time>.json``; each server
started, probed and stopped by hand: ``python bench/peers/compare.py servers [SERVER ...]``.
Other scripts of ``bench/peers/`` import the package's modules (``token_batching.py`` drives
its servers with :mod:`comparison.generator` and :mod:`comparison.servers`).
"""

from __future__ import annotations
