"""The kernel's OS sandbox: bubblewrap with a seccomp filter and a pids cgroup.

``_sandbox`` resolves the configuration and builds the bwrap command line, ``_seccomp`` the syscall
filter it installs, ``_cgroup`` the per-kernel process limit. A second backend (another isolation
technology, or a remote host) is a sibling of these modules behind the same two calls the kernel
makes: `resolve_sandbox` and `bwrap_argv`.
"""
