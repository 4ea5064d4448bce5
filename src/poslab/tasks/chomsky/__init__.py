"""The Chomsky-hierarchy length-generalization tasks (Delétang et al. 2023; Ruoss et al. 2023).

Fifteen tasks in the sources' encoder form (:mod:`poslab.tasks.chomsky.format`): regular
(:mod:`.regular`), context-free (:mod:`.context_free`) and context-sensitive
(:mod:`.context_sensitive`), each registered in :data:`poslab.tasks.TASKS` under the sources'
task name.
"""
