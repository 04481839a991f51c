"""Runtimes: load compiled artifacts and run programs. They import nothing else of minicomp."""
