"""Why a child is silent: evidence sampled from outside, a cause named from it, an incident report written.

:mod:`.evidence` samples the silent tree (CPU, I/O, process states, compilers, kernel caches, GPU memory) into a
:class:`.window.Window`; :func:`.causes.classify` names the cause from that window and the stacks, a pure
function; :mod:`.incident` writes what the run looked like before anything is killed.
"""
