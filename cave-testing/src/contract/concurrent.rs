//! Host calls made side by side: from a cell's threads, from `asyncio.gather` over
//! `asyncio.to_thread`, and through the awaitable form `f.aio(...)`.
//!
//! No check here measures time: a host function meets its peers (it waits until as many calls
//! as the cell made are in flight at once) and fails the call if they never all arrive, so calls
//! that a runtime serialises fail the check instead of merely slowing it.

use super::run;
use cave_core::{
    Args, Function, HostError, HostObject, Method, ObjectBinding, Param, Resources, Runtime,
    Signature, Value,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How long a call waits for its peers before it fails (far beyond any machine's scheduling).
const MEETING: Duration = Duration::from_secs(30);

/// Calls that wait for each other: each call of `meet(i, n)` returns `2 * i` once `n` calls
/// are in flight at once, and fails with `TimeoutError` if they never are.
#[derive(Debug, Default)]
struct Meeting {
    in_flight: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Meeting {
    async fn meet(&self, args: Args) -> Result<Value, HostError> {
        let i: i64 = args.get("i")?;
        let n: usize = args.get("n")?;
        let arrived = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.notify.notify_waiters();
        let met = tokio::time::timeout(MEETING, async {
            loop {
                let notified = self.notify.notified();
                if self.in_flight.load(Ordering::SeqCst) >= n {
                    break;
                }
                notified.await;
            }
        })
        .await;
        if met.is_err() {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(HostError::new(
                "TimeoutError",
                format!(
                    "call {i} met only {arrived} of {n} calls in flight: the calls ran one after another"
                ),
            ));
        }
        Ok(Value::Int((2 * i).into()))
    }

    /// Marks a group's end (every call of it returned).
    fn reset(&self) {
        self.in_flight.store(0, Ordering::SeqCst);
    }
}

/// The host object form of the meeting.
#[derive(Debug)]
struct Hub(Arc<Meeting>);

#[async_trait::async_trait]
impl HostObject for Hub {
    fn type_name(&self) -> &str {
        "Hub"
    }
    fn methods(&self) -> Vec<Method> {
        vec![Method::new("meet", meet_signature()).with_doc("Meets the other calls.")]
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        match method {
            "meet" => self.0.meet(args).await,
            other => Err(HostError::new(
                "AttributeError",
                format!("no method {other}"),
            )),
        }
    }
}

fn meet_signature() -> Signature {
    Signature::new([
        Param::new("i").annotated("int"),
        Param::new("n").annotated("int"),
    ])
    .returns("int")
}

/// Registers `meet` (a function), `hub.meet` (a method) and `reset_meeting()`.
async fn register_meeting(rt: &dyn Runtime) {
    let meeting = Arc::new(Meeting::default());
    let function = meeting.clone();
    let meet = Function::host("meet", meet_signature(), move |args: Args| {
        let meeting = function.clone();
        async move { meeting.meet(args).await }
    })
    .with_doc("Meets the other calls.");
    let resetting = meeting.clone();
    let reset = Function::host("reset_meeting", Signature::default(), move |_args: Args| {
        resetting.reset();
        async move { Ok(Value::None) }
    });
    rt.register(
        Resources::new()
            .function(meet)
            .function(reset)
            .object(ObjectBinding::new("hub", Arc::new(Hub(meeting)))),
    )
    .await
    .expect("registers");
}

/// Host calls from `asyncio.gather` over `asyncio.to_thread`, through the awaitable form of a
/// function and of a method, and from a cell's own threads, are all in flight at once (50 of
/// them for the awaitable forms), each answered with its own result.
pub async fn host_calls_run_side_by_side(rt: &dyn Runtime) {
    register_meeting(rt).await;
    let cells = [
        "import asyncio\nr = await asyncio.gather(*[asyncio.to_thread(meet, i, 10) for i in range(10)])\nprint(r == [2 * i for i in range(10)])",
        "reset_meeting()\nr = await asyncio.gather(*[meet.aio(i=i, n=50) for i in range(50)])\nprint(r == [2 * i for i in range(50)])",
        "reset_meeting()\nr = await asyncio.gather(*[hub.meet.aio(i, 50) for i in range(50)])\nprint(r == [2 * i for i in range(50)])",
        "import threading\nreset_meeting()\nr = [None] * 8\ndef work(i):\n    r[i] = meet(i, 8)\nthreads = [threading.Thread(target=work, args=(i,)) for i in range(8)]\nfor t in threads:\n    t.start()\nfor t in threads:\n    t.join()\nprint(r == [2 * i for i in range(8)])",
    ];
    for code in cells {
        let out = run(rt, code).await;
        if out.error.is_some() || out.output != "True\n" {
            // Output that arrives late would show in the next cell's.
            let next = run(rt, "print('next')").await;
            panic!("{code}\n{out:?}\nthe next cell: {next:?}");
        }
    }
    // The protocol is whole afterwards: a plain call and a plain cell.
    let out = run(rt, "reset_meeting()\nprint(meet(3, 1), 1 + 1)").await;
    assert_eq!(out.output, "6 2\n", "{out:?}");
}

/// An exception one of many concurrent calls raises reaches the cell's `try`/`except`, and
/// the others' results are kept (`return_exceptions=True`).
pub async fn a_failing_call_among_many_reaches_the_cell(rt: &dyn Runtime) {
    let pick = Function::host(
        "pick",
        Signature::new([Param::new("i").annotated("int")]).returns("int"),
        |args: Args| async move {
            let i: i64 = args.get("i")?;
            tokio::time::sleep(Duration::from_millis(20)).await;
            if i == 3 {
                return Err(HostError::new("ValueError", "three is not allowed"));
            }
            Ok(Value::Int(i.into()))
        },
    );
    rt.register(Resources::new().function(pick))
        .await
        .expect("registers");
    let out = run(
        rt,
        "import asyncio
try:
    await asyncio.gather(*[pick.aio(i) for i in range(6)])
except ValueError as e:
    print('caught:', e)
r = await asyncio.gather(*[asyncio.to_thread(pick, i) for i in range(6)], return_exceptions=True)
print([x if isinstance(x, int) else type(x).__name__ for x in r])",
    )
    .await;
    assert!(out.error.is_none(), "{out:?}");
    assert_eq!(
        out.output,
        "caught: three is not allowed\n[0, 1, 2, 'ValueError', 4, 5]\n"
    );
}

/// Calls a cell still has in flight when it ends (its threads', left running) are dropped
/// with it: their futures are dropped and the waiting threads get `KeyboardInterrupt`, and
/// the next cell runs at once.
pub async fn calls_in_flight_end_with_their_cell(rt: &dyn Runtime) {
    /// Counts the futures dropped.
    struct Dropped(Arc<AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let (counter, entering) = (dropped.clone(), entered.clone());
    let hang = Function::host("hang", Signature::default(), move |_args: Args| {
        entering.fetch_add(1, Ordering::SeqCst);
        let guard = Dropped(counter.clone());
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok(Value::None)
        }
    });
    let entered_now = entered.clone();
    let arrived = Function::host("arrived", Signature::default(), move |_args: Args| {
        let n = entered_now.load(Ordering::SeqCst);
        async move { Ok(Value::Int(n as i128)) }
    });
    rt.register(Resources::new().function(hang).function(arrived))
        .await
        .expect("registers");
    let out = run(
        rt,
        "import threading, time
seen = []
def wait():
    try:
        hang()
    except BaseException as e:
        seen.append(type(e).__name__)
threads = [threading.Thread(target=wait) for _ in range(4)]
for t in threads:
    t.start()
for _ in range(2000):
    if arrived() == 4:
        break
    time.sleep(0.01)
print(arrived())",
    )
    .await;
    assert_eq!(out.output, "4\n", "{out:?}");
    let next = tokio::time::timeout(
        Duration::from_secs(60),
        run(rt, "for t in threads:\n    t.join(30)\nprint(sorted(seen))"),
    )
    .await
    .expect("the next cell ran");
    assert_eq!(
        next.output,
        "['KeyboardInterrupt', 'KeyboardInterrupt', 'KeyboardInterrupt', 'KeyboardInterrupt']\n",
        "{next:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dropped.load(Ordering::SeqCst) < 4 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        4,
        "every call's future was dropped"
    );
}
