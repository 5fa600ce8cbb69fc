//! The guard: where the host cannot make a control group, the process it starts for a kernel
//! child forks the worker and stays its parent, outside the sandbox, so that nothing a session
//! started outlives it even when the host is killed.
//!
//! The guard is a child subreaper: whatever a cell detaches (a double-forked `setsid` daemon)
//! is orphaned to it, never beyond it. It watches two things: the host's end of the socket
//! (closed when the host stopped, dropped or lost the runtime, or died by SIGKILL) and its
//! children (SIGCHLD through a signalfd, reaping every orphan). When the host's end closes, or
//! the serving process ends (a crash, or its exit at `stop`), it stops, then kills, every
//! process beneath it, and ends with the serving process's status, which is what the host waits
//! for. The worker, and every copy that takes over from it at a rollback, tells it on a pipe
//! (`ANNOUNCE_FD`) which process serves, and which processes lead branches, whose trees are
//! spared (a branch outlives the session it was forked from).
//!
//! The guard is a fork of the host that never calls `exec`: it makes only async-signal-safe
//! system calls on buffers of its own stack, and it closes every descriptor of the host's
//! before it waits (a copy held here would keep another session's socket open).

use std::io;

/// The descriptor on which the worker announces to the guard (8 bytes each, little-endian: a
/// positive pid serves from now on, a negative one leads a branch).
pub(crate) const ANNOUNCE_FD: i32 = 6;

/// Where the guard keeps the announcements' read end (its copy of the shadow's place).
const ANNOUNCED: i32 = 4;

/// Most branches whose trees one guard spares.
const MOST_SPARED: usize = 256;

/// Most processes one kill stops per round (more are found in the next round).
const MOST_STOPPED: usize = 8192;

/// In the host's forked child, once its socket is at `socket` (the child's descriptor 3, below
/// the guard's `ANNOUNCED`, which it overwrites): forks the worker, which returns here (to go
/// on to `exec`); the guard never returns.
///
/// # Safety
/// Only between `fork` and `exec`, in the child, with `socket` open: the guard then lives on
/// in that forked copy of the host, making only async-signal-safe calls.
pub(crate) unsafe fn split(socket: i32) -> io::Result<()> {
    let failed = io::Error::last_os_error;
    let mut ends = [0; 2];
    // SAFETY: plain system calls on values of this frame.
    unsafe {
        if libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(failed());
        }
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) != 0 {
            return Err(failed());
        }
        let guard = libc::getpid();
        match libc::fork() {
            -1 => Err(failed()),
            0 => {
                // The worker: the announcements' write end at its place, across `exec`.
                libc::close(ends[0]);
                let high = libc::fcntl(ends[1], libc::F_DUPFD_CLOEXEC, 10);
                if high < 0 || libc::dup2(high, ANNOUNCE_FD) < 0 {
                    return Err(failed());
                }
                libc::close(high);
                libc::close(ends[1]);
                // It dies with the guard (the guard kills it first whenever it can).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(failed());
                }
                if libc::getppid() != guard {
                    libc::_exit(1);
                }
                Ok(())
            }
            worker => watch(worker, ends[0], socket),
        }
    }
}

/// The guard's life: see the module's documentation.
///
/// # Safety
/// As [`split`]: in the forked copy of the host, single-threaded.
unsafe fn watch(worker: i32, announced: i32, socket: i32) -> ! {
    // SAFETY: system calls on descriptors and buffers of this frame.
    unsafe {
        // Nothing of the host's but the socket (below `ANNOUNCED`: see `split`) and the
        // announcements.
        libc::dup2(announced, ANNOUNCED);
        for fd in 0..3 {
            libc::close(fd);
        }
        close_from(ANNOUNCED + 1);
        libc::fcntl(ANNOUNCED, libc::F_SETFL, libc::O_NONBLOCK);
        // The host's signal handlers are not this process's.
        for signal in 1..=libc::SIGRTMAX() {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        let mut children: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut children);
        libc::sigaddset(&mut children, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_SETMASK, &children, std::ptr::null_mut());
        let signals = libc::signalfd(-1, &children, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        // A guard that ends by its worker's signal leaves no core (a copy of the host's memory).
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);

        let mut state = Watched {
            serving: worker,
            spared: [0; MOST_SPARED],
            spared_count: 0,
            pending: [0; 8],
            pending_len: 0,
        };
        let mut fds = [
            libc::pollfd {
                fd: socket,
                events: libc::POLLRDHUP,
                revents: 0,
            },
            libc::pollfd {
                fd: ANNOUNCED,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: signals,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Without a signalfd (a seccomp filter of the host's own), children are looked at
        // every 50 ms.
        let timeout = if signals < 0 { 50 } else { -1 };
        loop {
            let ready = libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout);
            if ready < 0 && *libc::__errno_location() != libc::EINTR {
                state.end(None);
            }
            // Announcements first: a copy that took over is known before its predecessor's
            // end is seen.
            if fds[1].revents != 0 && !state.read_announcements() {
                fds[1].fd = -1;
            }
            if fds[2].revents != 0 {
                let mut info = [0u8; 128];
                while libc::read(signals, info.as_mut_ptr().cast(), info.len()) > 0 {}
            }
            state.reap();
            if fds[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL)
                != 0
            {
                state.end(None);
            }
        }
    }
}

/// What the guard knows: who serves, which branches to spare, a partly read announcement.
struct Watched {
    serving: i32,
    spared: [i32; MOST_SPARED],
    spared_count: usize,
    pending: [u8; 8],
    pending_len: usize,
}

impl Watched {
    /// Reads what is announced; false once every writer is gone.
    fn read_announcements(&mut self) -> bool {
        let mut buffer = [0u8; 512];
        loop {
            // SAFETY: a read into a buffer of this frame.
            let n = unsafe { libc::read(ANNOUNCED, buffer.as_mut_ptr().cast(), buffer.len()) };
            if n == 0 {
                return false;
            }
            if n < 0 {
                return true;
            }
            for &byte in &buffer[..n as usize] {
                self.pending[self.pending_len] = byte;
                self.pending_len += 1;
                if self.pending_len == 8 {
                    self.pending_len = 0;
                    let pid = i64::from_le_bytes(self.pending);
                    if pid > 0 {
                        self.serving = pid as i32;
                    } else if pid < 0 && self.spared_count < MOST_SPARED {
                        self.spared[self.spared_count] = (-pid) as i32;
                        self.spared_count += 1;
                    }
                }
            }
        }
    }

    /// Reaps every child that has ended; ends the guard when the serving process has.
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own children.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if pid == self.serving {
                self.end(Some(status));
            }
            if let Some(i) = self.spared[..self.spared_count]
                .iter()
                .position(|&p| p == pid)
            {
                self.spared_count -= 1;
                self.spared[i] = self.spared[self.spared_count];
            }
        }
    }

    /// Kills every process beneath the guard but the spared branches, and ends as the serving
    /// process did (`status`), or plainly when the host's end closed (`None`).
    fn end(&self, status: Option<i32>) -> ! {
        kill_tree(&self.spared[..self.spared_count]);
        // SAFETY: system calls ending this process.
        unsafe {
            if let Some(status) = status {
                if libc::WIFSIGNALED(status) {
                    let signal = libc::WTERMSIG(status);
                    libc::signal(signal, libc::SIG_DFL);
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, signal);
                    libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                    libc::kill(libc::getpid(), signal);
                    libc::_exit(128 + signal);
                }
                libc::_exit(libc::WEXITSTATUS(status));
            }
            libc::_exit(0)
        }
    }
}

/// Closes every descriptor from `first` up.
///
/// # Safety
/// Closes descriptors other owners may hold: only in the guard.
unsafe fn close_from(first: i32) {
    // SAFETY: closing descriptors of this process (see above).
    unsafe {
        if libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) != 0 {
            // Before Linux 5.9: one by one, up to the open-files limit.
            let mut limit: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            let last = limit.rlim_cur.min(1 << 20) as i32;
            for fd in first..last {
                libc::close(fd);
            }
        }
    }
}

/// A set of pids on the stack: open addressing, no allocation.
struct PidSet {
    slots: [i32; 2 * MOST_STOPPED],
    len: usize,
}

impl PidSet {
    fn new() -> Self {
        Self {
            slots: [0; 2 * MOST_STOPPED],
            len: 0,
        }
    }
    /// Adds `pid`; false when it was there already or the set is full.
    fn insert(&mut self, pid: i32) -> bool {
        if self.len >= MOST_STOPPED {
            return false;
        }
        let mut i = (pid as u32 as usize).wrapping_mul(2654435761) % self.slots.len();
        loop {
            match self.slots[i] {
                0 => {
                    self.slots[i] = pid;
                    self.len += 1;
                    return true;
                }
                p if p == pid => return false,
                _ => i = (i + 1) % self.slots.len(),
            }
        }
    }
}

/// Stops, then kills, every descendant of this process but the trees of `spared`. Each is
/// stopped before its children are read, so none forks behind the walk; the walk is made again
/// until it finds none it has not stopped (a stop is delivered a little after it is sent, and
/// what ends meanwhile orphans its children to this process).
fn kill_tree(spared: &[i32]) {
    let mut stopped = PidSet::new();
    // SAFETY: getpid.
    let me = unsafe { libc::getpid() };
    for _round in 0..50 {
        let mut queue = [0i32; MOST_STOPPED];
        let mut queued = 0;
        let mut walked = PidSet::new();
        let mut found = false;
        children(me, &mut queue, &mut queued);
        while queued > 0 {
            queued -= 1;
            let pid = queue[queued];
            if spared.contains(&pid) || !walked.insert(pid) {
                continue;
            }
            if stopped.insert(pid) {
                found = true;
                // SAFETY: a signal to a descendant of this process.
                unsafe {
                    libc::kill(pid, libc::SIGSTOP);
                }
            }
            children(pid, &mut queue, &mut queued);
        }
        if !found {
            break;
        }
    }
    for &pid in stopped.slots.iter().filter(|&&p| p != 0) {
        // SAFETY: as above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Appends the children of `pid` (every thread's, from `/proc`) to `queue`, as far as it has room.
fn children(pid: i32, queue: &mut [i32], queued: &mut usize) {
    let mut path = Path::new();
    path.push(b"/proc/");
    path.push_number(pid as u64);
    path.push(b"/task\0");
    // SAFETY: open/getdents64/close on a buffer of this frame.
    unsafe {
        let dir = libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir < 0 {
            return;
        }
        let mut entries = [0u8; 4096];
        loop {
            let n = libc::syscall(
                libc::SYS_getdents64,
                dir,
                entries.as_mut_ptr(),
                entries.len(),
            );
            if n <= 0 {
                break;
            }
            let mut at = 0usize;
            while at + 19 < n as usize {
                // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
                let reclen = u16::from_ne_bytes([entries[at + 16], entries[at + 17]]) as usize;
                if reclen == 0 {
                    break;
                }
                let name = &entries[at + 19..(at + reclen).min(n as usize)];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                if let Some(tid) = parse(name) {
                    let mut file = Path::new();
                    file.push(b"/proc/");
                    file.push_number(pid as u64);
                    file.push(b"/task/");
                    file.push_number(tid);
                    file.push(b"/children\0");
                    read_pids(&file, queue, queued);
                }
                at += reclen;
            }
        }
        libc::close(dir);
    }
}

/// Appends the pids listed in the file at `path` (numbers separated by spaces).
fn read_pids(path: &Path, queue: &mut [i32], queued: &mut usize) {
    // SAFETY: open/read/close on a buffer of this frame.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let mut buffer = [0u8; 4096];
        let mut number: u64 = 0;
        let mut digits = false;
        loop {
            let n = libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len());
            if n <= 0 {
                break;
            }
            for &byte in &buffer[..n as usize] {
                if byte.is_ascii_digit() {
                    number = number
                        .saturating_mul(10)
                        .saturating_add(u64::from(byte - b'0'));
                    digits = true;
                } else if digits {
                    if *queued < queue.len() {
                        queue[*queued] = number as i32;
                        *queued += 1;
                    }
                    number = 0;
                    digits = false;
                }
            }
        }
        if digits && *queued < queue.len() {
            queue[*queued] = number as i32;
            *queued += 1;
        }
        libc::close(fd);
    }
}

/// A decimal number of ASCII digits, or `None`.
fn parse(name: &[u8]) -> Option<u64> {
    if name.is_empty() || name.len() > 10 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(name.iter().fold(0u64, |n, &b| n * 10 + u64::from(b - b'0')))
}

/// A path built on the stack (no allocation between `fork` and `exec`).
struct Path {
    bytes: [u8; 64],
    len: usize,
}

impl Path {
    fn new() -> Self {
        Self {
            bytes: [0; 64],
            len: 0,
        }
    }
    fn push(&mut self, part: &[u8]) {
        let room = self.bytes.len() - self.len;
        let n = part.len().min(room);
        self.bytes[self.len..self.len + n].copy_from_slice(&part[..n]);
        self.len += n;
    }
    fn push_number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
    fn as_ptr(&self) -> *const libc::c_char {
        self.bytes.as_ptr().cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_numbers_are_built_without_allocation() {
        let mut path = Path::new();
        path.push(b"/proc/");
        path.push_number(4_194_304);
        path.push(b"/task\0");
        assert_eq!(&path.bytes[..path.len], b"/proc/4194304/task\0");
        assert_eq!(parse(b"123"), Some(123));
        assert_eq!(parse(b"."), None);
        assert_eq!(parse(b"12345678901"), None);
    }

    #[test]
    fn the_pid_set_holds_each_once() {
        let mut set = PidSet::new();
        assert!(set.insert(7));
        assert!(!set.insert(7));
        assert!(set.insert(8));
        for pid in 1..MOST_STOPPED as i32 + 10 {
            set.insert(pid);
        }
        assert_eq!(set.len, MOST_STOPPED);
    }
}
