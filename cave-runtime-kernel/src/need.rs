//! What of this machine the kernel runtime's isolation uses, and why a machine lacks it: the
//! checks `cave doctor` makes, named so that a test needing one can skip where it is missing
//! (and `cargo xtask test` can say so before it runs them).

/// Something of the machine the kernel runtime's isolation uses, which a machine may lack
/// (most containers and a chroot lack the first two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Need {
    /// A control group per child (a writable cgroup v2 group, or the v1 `pids` hierarchy): the
    /// memory limit as a kill, a process limit that holds for root.
    ControlGroups,
    /// User and network namespaces for an unprivileged process: the sandbox's own network,
    /// and the egress allowlist through it.
    Namespaces,
    /// Landlock: the sandbox's filesystem rules (and TCP rules from ABI 4).
    Landlock,
    /// Landlock's TCP rules (ABI 4, Linux 6.7): with seccomp, the egress allowlist where there
    /// are no namespaces.
    LandlockTcp,
    /// seccomp: the sandbox's system-call filter.
    Seccomp,
}

impl Need {
    /// Every need, in the order `cave doctor` lists them.
    pub const ALL: [Need; 5] = [
        Need::ControlGroups,
        Need::Namespaces,
        Need::Landlock,
        Need::LandlockTcp,
        Need::Seccomp,
    ];

    /// Its name, as `cave doctor` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Need::ControlGroups => "control groups",
            Need::Namespaces => "namespaces",
            Need::Landlock => "Landlock",
            Need::LandlockTcp => "Landlock TCP rules",
            Need::Seccomp => "seccomp",
        }
    }

    /// What this machine lacks, named, with why (`control groups: …`), or `None` when it
    /// has it (probed once per process).
    pub fn lacking(self) -> Option<String> {
        let why = match self {
            Need::ControlGroups => (!crate::cgroup::available()).then(|| {
                "this process's control group is neither a writable cgroup v2 group nor in a writable v1 pids hierarchy (a container or a chroot)".to_owned()
            }),
            Need::Namespaces => crate::sandbox::namespaces_allowed().err(),
            Need::Landlock => crate::sandbox::landlock_abi().err(),
            Need::LandlockTcp => crate::sandbox::landlock_tcp().err(),
            Need::Seccomp => crate::sandbox::seccomp_available().err(),
        };
        why.map(|why| format!("{}: {why}", self.name()))
    }
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_need_has_a_distinct_name() {
        let names: std::collections::HashSet<&str> = Need::ALL.iter().map(|n| n.name()).collect();
        assert_eq!(names.len(), Need::ALL.len());
    }
}
