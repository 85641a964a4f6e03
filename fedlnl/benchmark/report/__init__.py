"""`fedlnl-report DIR`: run summaries -> paper-style tables (md/csv/tex) and plots in DIR/report.

Reads every ``summary.json`` below DIR (never logs or W&B). A run directory whose summary is
missing (``metrics.jsonl`` only: still running or killed), unreadable, partial or not ``complete``
is not averaged; it is counted and listed as an incomplete run, so a partial sweep gives a table
with "missing" cells. Runs without a summary are placed in the table from their
``.hydra/config.yaml`` when there is one (best effort).

Tables: rows are ``--rows`` (default ``method``); columns are setting groups. By default a column
is the noise ``(rho,tau)`` plus ``non-IID (p,alpha)`` for non-IID partitions (``IID`` when IID and
non-IID runs are mixed; other partitions by name, ``shards``, ``classes``, ``dirichlet (α=...)``, with
their own keys such as ``s=2`` or ``sizes=lognormal`` when they vary); method (unless it is the row key), dataset, model, ``N=`` clients and any
other key of the runner's ``setting`` (e.g. ``fidelity=paper``) join the label whenever they vary,
so runs of different configurations are never pooled. ``--by KEY`` adds keys (any summary key,
setting key or dotted config key such as ``config.method.beta``; a bare ``method.beta`` is looked
up under ``config.`` too). A cell is the mean ± std over seeds of the metric in %, with the number
n of complete runs. The std is the population std (ddof=0): the papers (FedCorr, FedDiv) report
"mean ± std over 5 trials" without saying which; with n = 5, ddof=1 would be sqrt(5/4) = 1.118
times larger. The best mean of each column (compared at the printed 2 decimals) is bold.

Method families: when the summaries record ``family`` (each method class names one of
``fedlnl.methods.common.families.FAMILIES``), the rows of every table (Markdown, LaTeX, HTML, and
the win/tie/loss matrix) are grouped under a heading row per family, in FAMILIES order, then any
other family name alphabetically, then "other" (rows none of whose runs records a family: older
summaries, runs without a summary; one note line names them); within a family rows are sorted by
name, so ablation variants follow their method. The csv files (accuracy, comm, detection, ranks)
get a ``family`` column. Grouping is for reading only: bold, the tests against a column's best, the
ranks and the Friedman test are over all rows. No run with a family, ``--rows family`` or rows
whose runs name several families (rows that are not methods): no grouping.

Communication (FedCorr appendix B, C.3, Tables 11-13): total cost (client participations) and cost
to each accuracy target, as means over the complete seeds; a target is averaged over the seeds that
reached it ("[k/n]" when not all did) and is "-" when none did; a target that no run of any cell
reached (and no paper cost is beside) gets one line under the tables instead of a table of "-".
``--ratio-to METHOD`` adds the ratio
to that row's value in the same column, as FedCorr prints in brackets.

Ablations: a run with ``variant`` set (e.g. ``variant="w/o correction"``) is its own row,
"method (variant)"; ``--ratio-to`` and the reference numbers use the bare method name plus variant.

Paper numbers: when the summaries carry ``preset`` (paper presets set it) the report reads
``results/reference/<preset>.csv`` of the current directory if there is one, else the copy shipped
as package data, ``fedlnl/benchmark/reference/<preset>.csv`` (``--reference FILE`` picks a file), long format (accuracies in %, costs in client
participations; method, model and variant spelled as in our configs, case-insensitive)::

    method,variant,dataset,model,partition,rho,tau,p,alpha,target,metric,mean,std,source

(``metric`` best_acc, or cost_to_target with ``target`` = ζ as a fraction or in %; an empty key is
a wildcard, except ``variant``: empty = the plain method; an empty ``mean`` of a cost = never
reached, "-"; the dataset is matched on the summary's ``setting.family``, e.g. ``cifar10`` for
``cifar10_jpeg``, or for older summaries without it on a legacy alias). Each cell then shows the paper
value beside ours with Δ = ours − paper (percentage points for accuracy, participations for
costs) in accuracy.{md,csv,tex} and comm.{md,csv}. A cell of the reference grid without any run
is "missing" in a shown column and summarised per row otherwise (below), so a partial sweep shows
what is left to run.

Figures (``--figures``): ``summary`` (default) draws acc_vs_cost.png and, for one representative
run (lowest seed) of every table cell, the per-run figures in DIR/report/runs/<row>_<column>_seed<k>/:
curve.png (test accuracy vs communication cost with the training stages, FedCorr Fig. 9),
lid_gmm.png (cumulative LID scores and the fitted GMM, Figs. 3 and 6; methods that record
``lid``), lid_iterations.png (the same after each iteration, from ``lid/iter<t>``),
noise_estimation.png (estimated vs true noise level per client, Fig. 7; methods that report
mu_hat), partition.png (class counts per client, Fig. 10), confusion.png (labels before and after
correction, Fig. 8; one panel when nothing was corrected). ``all`` draws them for every complete
run, ``none`` draws nothing (acc_vs_cost.png included).
They come from each run's metrics.jsonl and diagnostics.json alone (no W&B).

Pooling guards: runs of one cell that differ in any resolved ``config`` key besides the seed and
the keys the config hash ignores (``fedlnl.conf.keys.NON_RESULT_KEYS``; ``threads`` is not one)
are never averaged as seeds: such keys join the column label (and a WARNING says so). A cell with
fewer complete seeds than the table (every seed any run of the table used) is listed with its n and
the missing seeds. When the complete runs of a column differ in a local-training value actually used
(``effective.*`` of the summaries, e.g. lr, or stage3.lr for FedCorr+X), one WARNING line per column
is logged and written under the table. Summaries without ``effective`` or ``setting.family`` work.

Statistics (``stats``; docs/user-guide.md "The report"): per column, every row against the column's
best by a paired test over the seeds both completed (``--test`` ttest, from 2 pairs, or wilcoxon),
Holm-corrected, ``--alpha``; the best mean is bold and a row not significantly worse is marked †; a
95% percentile-bootstrap CI of the mean beside mean ± std. Across the columns: mean ranks, the
Friedman test and the Nemenyi critical difference (cd_diagram.png), a win/tie/loss matrix, and for
paper presets Kendall τ between our ordering and the paper's per column and pooled. Too few runs
for a test: "not enough runs", never a p-value from one seed.

Partial sweeps: only the columns holding a run are shown; the cells of the reference grid without
runs are one line per row (count and compact range), all listed in notes.md (``--full-grid``: every
column). Notes: one line per kind under the table (count, cells touched), in full in notes.md.

Metric (``report.metric``): ``--metric`` auto (default: ``selected_acc``, the test accuracy at the
round of best noisy-validation accuracy, when every complete run has one, i.e. ran with
``selection.val_share`` > 0; else ``best_acc``, the papers' protocol, and a note when the runs mix
both), selected_acc (alias ``selected``), best_acc, final_acc, last10_acc or their balanced versions
(``balanced_acc`` = best_balanced_acc beside last10_balanced_acc, costs from
cost_to_target_balanced, curves from metrics.jsonl's balanced_acc); ``--beside`` (default: last10
of the same accuracy). Every table names its metric in words: the caption (md, tex comment, html),
a ``metric`` column in accuracy/ranks/wtl/agreement.csv, the heading of stats.md. With
selected_acc, paper values are the papers' best_acc (their protocol; the caption says so); the
per-run curve.png marks the selected round. Runs without the metric are one line.

Clean-data control (``report.control``, issue 32): at ρ = τ = 0 a row "degrades clean data" (‡ after
its main value, a note line) when it trails FedAvg by more than the papers' own (0,0) gap + 3
points, or its last-10 accuracy is more than 3 points below its best.

Per-client accuracy (``report.clients``): clients.{md,csv} (client_acc_mean, client_acc_worst10,
client_gap: mean ± std over seeds, at each run's reported round) and clients.png (accuracy per
client vs its realised noise rate, one panel per method, a row per family); without the keys one
note line.

Win/tie/loss matrix: only the rows with a tested pair; none tested (one seed): one line saying why.

Bad input (empty directory, a reference CSV that is malformed or matches no run, bad options, an
``--out`` that cannot be written): one ``fedlnl-report: error:`` line on stderr, exit code 2; a write
failing midway: exit 1. The report folder holds an ``INCOMPLETE`` file from the first file written
to the last (an earlier report's files, ``cli.OUTPUTS``, are removed first): an interrupted report
(Ctrl-C: exit 130, SIGTERM: 143, or killed) keeps it.

Outputs in DIR/report: report.html (self-contained: every table and figure, statistics, notes,
the commands that made the runs), accuracy.{md,csv,tex} (``--metric`` and, beside it in every
column, ``--beside``), stats.{md,json}, ranks.csv, wtl.csv, agreement.csv (presets), notes.md,
clients.{md,csv}, clients.png, comm.{md,csv,tex}, detection.{md,csv,tex} (noisy-client P/R/F1, μ̂ MAE, relabel accuracy, noise
after correction: mean ± std over seeds), compute.{md,csv} (CPU minutes, wall minutes and local
steps per run: mean ± std over seeds; the sweep's CPU hours with each shared prefix counted once),
noise.{md,csv} (requested vs realised noise per column and seed), acc_vs_cost.png (mean accuracy over seeds vs communication cost, one panel per column titled
with its axes, e.g. "ρ=0.6, τ=0.5"; rows named ``*_central`` or without communication as horizontal
lines; with more than 8 curves and recorded families, one row of panels per family, at most 7
curves a panel (a larger family is cut into parts), fedavg dashed in every panel), cd_diagram.png
(sized by the number of methods, labels coloured by family), runs/*/*.png (also noise_realised.png:
requested vs realised noise per client). csv files are in long form, accuracies in %. With runs logged to W&B (``--wandb auto``), one
run "report" in the sweep's W&B group holds the tables, figures and page (``wandb_log``).
"""
from __future__ import annotations

from fedlnl.benchmark.report.cells import resolve_key, with_columns
from fedlnl.benchmark.report.cli import METRICS, main, parse_args, resolve_metric, write_report
from fedlnl.benchmark.report.figures import FIGURE_MODES, curves, figure_runs, mean_curve, run_figures
from fedlnl.benchmark.report.loading import load_summaries, read_metrics, row_label
from fedlnl.benchmark.report.reference import (add_missing_cells, load_reference, matches, read_reference,
                                               reference_paths, reference_row, run_identity)
from fedlnl.benchmark.report.tables import (accuracy_grid, accuracy_table, comm_markdown, comm_table,
                                            to_latex, to_markdown)

__all__ = ["FIGURE_MODES", "METRICS", "resolve_metric", "accuracy_grid", "accuracy_table", "add_missing_cells", "comm_markdown",
           "comm_table", "curves", "figure_runs", "load_reference", "load_summaries", "main", "matches",
           "mean_curve", "parse_args", "read_metrics", "read_reference", "reference_paths", "reference_row",
           "resolve_key", "row_label", "run_figures", "run_identity", "to_latex", "to_markdown",
           "with_columns", "write_report"]
