"""Environments: real benchmarks behind one text-in, text-out interface, run in a process pool.

Envs know no model: they take action text and return observation text, plus privileged
state that only the feedback layer (`jaxscaffold.feedback`) may read.
"""
