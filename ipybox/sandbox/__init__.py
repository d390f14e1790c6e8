"""The kernel's OS sandbox: bubblewrap with a seccomp filter, and pids and memory cgroups.

``_sandbox`` resolves the configuration and builds the bwrap command line, ``_seccomp`` the syscall
filter it installs, ``_cgroup`` the per-sandbox process and memory limits. A second backend (another
isolation technology, or a remote host) is a sibling of these modules behind the same two calls the
kernel makes: `resolve_sandbox` and `bwrap_argv`.
"""
