"""Checks of the fleet area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import Check

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("baseline.boot_id", "Baseline boot id",
          "the run's metrics against a saved baseline (gpucheck <command> --baseline FILE)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/fleet.md#baseline-boot-id"),
    Check("baseline.kernel_log", "Baseline kernel log",
          "the run's metrics against a saved baseline (gpucheck <command> --baseline FILE)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/fleet.md#baseline-kernel-log"),
    Check("baseline.metric", "Baseline metric",
          "the run's metrics against a saved baseline (gpucheck <command> --baseline FILE)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#baseline-metric"),
    Check("compare.environment", "Compare environment",
          "versions, environment and settings of A and B (gpucheck compare A.json B.json)",
          {W: A.FIX_CONFIG},
          "B's software or settings changed from A's: align them if the change was not "
          "intended (the action compare has always given this finding)",
          "docs/fleet.md#compare-environment"),
    Check("compare.facts", "Compare facts",
          "versions, environment and settings of A and B (gpucheck compare A.json B.json)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/fleet.md#compare-facts"),
    Check("compare.findings", "Compare findings",
          "WARN and FAIL findings of B that A did not have (gpucheck compare A.json B.json)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "WARN: no rule today: gpucheck's fallback for an unknown id (run again: cheap, and it "
          "tells a glitch from a lasting problem); FAIL: no rule today: gpucheck's fallback for "
          "an unknown id (an unexplained failure must not keep taking jobs)",
          "docs/fleet.md#compare-findings",
          relays=True),
    Check("compare.hardware", "Compare hardware",
          "GPU models and counts of A and B (gpucheck compare A.json B.json)",
          {F: A.DRAIN_NODE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#compare-hardware"),
    Check("compare.host_bound", "Compare host bound",
          "whether a figure is bound by the host (gpucheck compare A.json B.json)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#compare-host-bound"),
    Check("compare.metrics", "Compare metrics",
          "versions, environment and settings of A and B (gpucheck compare A.json B.json)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/fleet.md#compare-metrics"),
    Check("compare.missing", "Compare missing",
          "metrics of A absent from B (gpucheck compare A.json B.json)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#compare-missing"),
    Check("compare.noise", "Compare noise",
          "how much A's and B's figures varied inside their runs (gpucheck compare A.json "
          "B.json)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/fleet.md#compare-noise"),
    Check("compare.regression", "Compare regression",
          "B's metrics against A's beyond their noise (gpucheck compare A.json B.json)",
          {F: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#compare-regression"),
    Check("compare.setup", "Compare setup",
          "the run options of A and B (gpucheck compare A.json B.json)",
          {W: A.FIX_CONFIG},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#compare-setup"),
    Check("compare.versions", "Compare versions",
          "versions, environment and settings of A and B (gpucheck compare A.json B.json)",
          {W: A.FIX_CONFIG},
          "B's software or settings changed from A's: align them if the change was not "
          "intended (the action compare has always given this finding)",
          "docs/fleet.md#compare-versions"),
    Check("fleet.baseline", "Fleet baseline",
          "each node's metrics against the fleet baseline (gpucheck fleet DIR)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-baseline"),
    Check("fleet.coverage", "Fleet coverage",
          "the reports of a fleet directory (gpucheck fleet DIR)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/fleet.md#fleet-coverage"),
    Check("fleet.drift", "Fleet drift",
          "versions and settings of each node against the others (gpucheck fleet DIR)",
          {W: A.FIX_CONFIG, F: A.DRAIN_NODE},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-drift",
          relays=True),
    Check("fleet.duplicate_host", "Fleet duplicate host",
          "several reports of one host (gpucheck fleet DIR)",
          {W: A.FIX_CONFIG, F: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-duplicate-host"),
    Check("fleet.future_report", "Fleet future report",
          "report times against now (gpucheck fleet DIR)",
          {W: A.FIX_CONFIG},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-future-report"),
    Check("fleet.inputs", "Fleet inputs",
          "the reports of a fleet directory (gpucheck fleet DIR)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/fleet.md#fleet-inputs"),
    Check("fleet.missing", "Fleet missing",
          "the expected nodes against the reports found (gpucheck fleet DIR)",
          {F: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-missing"),
    Check("fleet.node", "Fleet node",
          "each node's own findings (gpucheck fleet DIR)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "WARN: no rule today: gpucheck's fallback for an unknown id (run again: cheap, and it "
          "tells a glitch from a lasting problem); FAIL: no rule today: gpucheck's fallback for "
          "an unknown id (an unexplained failure must not keep taking jobs)",
          "docs/fleet.md#fleet-node",
          relays=True),
    Check("fleet.outlier", "Fleet outlier",
          "each node's metrics against the fleet's (gpucheck fleet DIR)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-outlier"),
    Check("fleet.save_baseline", "Fleet save baseline",
          "whether the fleet baseline could be written (gpucheck fleet DIR)",
          {F: A.FIX_CONFIG},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-save-baseline"),
    Check("fleet.unexpected", "Fleet unexpected",
          "reports from nodes not expected (gpucheck fleet DIR)",
          {W: A.FIX_CONFIG},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-unexpected"),
    Check("fleet.unreadable", "Fleet unreadable",
          "every report file of the directory (gpucheck fleet DIR)",
          {W: A.RERUN},
          "the finding's own site names its action (per kind, per XID or per event); this "
          "default is what that site passes",
          "docs/fleet.md#fleet-unreadable"),
)
