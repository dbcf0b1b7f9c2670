"""The commands: `ncjax` and its subcommands (`main`: train, eval, export, audit, filter, ncbench, sweep), the
evaluation suite (`eval_suite`), the audits (`audit`, `web_audit` and its report `web_report`), NC-bench
(`ncbench`), the sweep's flags (`sweep`; the sweep itself is the library's `ncjax.sweep`) and the demo (`demo`).
Nothing in the library imports them. `python -m ncjax.main` and `python -m ncjax.demo` still run them: those root
modules only forward here."""
