//! What a session has cost: tokens by kind, money and where its figure came from, cells,
//! the runtime's processor time and memory, host calls by tool, network bytes. One [`Ledger`]
//! per agent, kept across its runs (and across a resumed session when the host hands it back),
//! read by the budgets before each step and each cell.

use crate::{HostError, Usage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most tools a ledger counts by name; calls of any further tool are counted together
/// under [`OTHER_TOOLS`] (a model can call as many names as it likes through `getattr`).
pub const MAX_LEDGER_TOOLS: usize = 1000;

/// The name calls of tools past [`MAX_LEDGER_TOOLS`] are counted under.
pub const OTHER_TOOLS: &str = "(other tools)";

/// The most characters of a tool's name a ledger keeps (a cell can call a method by any name
/// through `getattr`, and the call is counted before the object says there is none).
const MAX_TOOL_NAME: usize = 200;

/// Adds `calls` to `name`'s count in `map`: a name cut to [`MAX_TOOL_NAME`], and past
/// [`MAX_LEDGER_TOOLS`] names, [`OTHER_TOOLS`]. A name already counted allocates nothing.
fn count_into(map: &mut BTreeMap<String, u64>, name: &str, calls: u64) {
    let (name, _) = crate::shorten(name, MAX_TOOL_NAME);
    if let Some(n) = map.get_mut(name) {
        *n = n.saturating_add(calls);
    } else {
        let key = if map.len() < MAX_LEDGER_TOOLS {
            name
        } else {
            OTHER_TOOLS
        };
        let n = map.entry(key.to_owned()).or_default();
        *n = n.saturating_add(calls);
    }
}

/// A model's price, in US dollars per million tokens: what the ledger computes a call's cost
/// with when the provider reports none.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Price {
    /// Per million prompt tokens (those not read from the provider's cache).
    pub input: f64,
    /// Per million completion tokens (reasoning included).
    pub output: f64,
    /// Per million prompt tokens read from the cache; `None`: charged as `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
}

impl Price {
    /// A price per million prompt and completion tokens. Returns `None` unless both are finite
    /// and not negative.
    pub fn per_million(input: f64, output: f64) -> Option<Self> {
        let fine = |p: f64| p.is_finite() && p >= 0.0;
        (fine(input) && fine(output)).then_some(Self {
            input,
            output,
            cached_input: None,
        })
    }

    /// The same price, with cached prompt tokens charged `cached_input` per million. Returns
    /// `None` unless it is finite and not negative.
    pub fn with_cached_input(self, cached_input: f64) -> Option<Self> {
        (cached_input.is_finite() && cached_input >= 0.0).then_some(Self {
            cached_input: Some(cached_input),
            ..self
        })
    }

    /// What `usage` costs at this price, in US dollars.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let cached_price = self.cached_input.unwrap_or(self.input);
        ((usage.prompt_tokens - cached) as f64 * self.input
            + cached as f64 * cached_price
            + usage.completion_tokens as f64 * self.output)
            / 1e6
    }
}

/// Money spent on the model, in US dollars, by where each call's figure came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Cost {
    /// The whole: `reported + computed`.
    pub usd: f64,
    /// What the provider (a LiteLLM proxy, OpenRouter) reported for its calls.
    pub reported: f64,
    /// What was computed from the tokens and the [`Price`] for calls it reported nothing for.
    pub computed: f64,
    /// Model calls with neither a reported cost nor a price: `usd` leaves them out.
    #[serde(default)]
    pub unpriced_calls: u64,
}

/// Bytes and connections through the runtime's egress proxy (the kernel runtime with
/// `allow_net`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EgressTotals {
    /// Connections let through.
    pub connections: u64,
    /// Connections refused.
    pub refused: u64,
    /// Bytes sent out.
    pub sent: u64,
    /// Bytes received.
    pub received: u64,
}

/// A session's account. In JSON (the `stopped` event's `ledger`, the session file):
///
/// ```json
/// {"tokens": {"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280,
///             "cached_tokens": 1024, "reasoning_tokens": 0, "estimated": false},
///  "model_calls": 2, "model_seconds": 1.9,
///  "cost": {"usd": 0.0031, "reported": 0.0, "computed": 0.0031, "unpriced_calls": 0},
///  "cells": 1, "cell_seconds": 0.4, "cpu_seconds": 0.35, "peak_memory": 41943040,
///  "host_calls": {"weather.forecast": 3}, "mcp_calls": {"time.get_current_time": 1},
///  "refused_host_calls": 0,
///  "egress": {"connections": 1, "refused": 0, "sent": 517, "received": 4096}}
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Ledger {
    /// Tokens of every model call, by kind.
    pub tokens: Usage,
    /// Model calls made.
    pub model_calls: u64,
    /// Seconds spent in model calls, from each request to the end of its answer.
    pub model_seconds: f64,
    /// Money spent on the model.
    pub cost: Cost,
    /// Cells run (those the policy or the approver refused are not).
    pub cells: u64,
    /// Seconds cells ran, wall time.
    pub cell_seconds: f64,
    /// Processor seconds the runtime's code used while cells ran (`None`: the runtime cannot
    /// tell, such as a kernel behind a Jupyter server).
    pub cpu_seconds: Option<f64>,
    /// The most memory the runtime held, in bytes, when it can tell: the worker's control
    /// group or process for the kernel runtime, the host process for the in-process one.
    pub peak_memory: Option<u64>,
    /// Calls of host functions and methods, by name (`name`, or `object.method`).
    pub host_calls: BTreeMap<String, u64>,
    /// Calls of MCP servers' tools, by name (`server.tool`).
    pub mcp_calls: BTreeMap<String, u64>,
    /// Calls refused because the host-call budget was spent (the run stops after the cell).
    pub refused_host_calls: u64,
    /// Network traffic through the runtime's egress proxy.
    pub egress: EgressTotals,
}

impl Ledger {
    /// An empty account.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls of host functions and MCP tools together.
    pub fn total_calls(&self) -> u64 {
        self.host_calls
            .values()
            .chain(self.mcp_calls.values())
            .fold(0u64, |sum, n| sum.saturating_add(*n))
    }

    /// Charges one model call: its tokens, and its cost as reported (`reported`) or else at
    /// `price`.
    pub fn charge_call(&mut self, usage: Usage, reported: Option<f64>, price: Option<&Price>) {
        self.tokens += usage;
        self.add_cost(&usage, reported, price, 1.0);
    }

    /// Takes back a call charged with `usage` and `reported` (an estimate the provider's late
    /// figures replace), without counting a call less.
    pub fn uncharge_call(&mut self, usage: Usage, reported: Option<f64>, price: Option<&Price>) {
        self.tokens = self.tokens.saturating_sub(usage);
        self.add_cost(&usage, reported, price, -1.0);
    }

    fn add_cost(&mut self, usage: &Usage, reported: Option<f64>, price: Option<&Price>, sign: f64) {
        let cost = &mut self.cost;
        match (reported.filter(|c| c.is_finite() && *c >= 0.0), price) {
            (Some(usd), _) => cost.reported = (cost.reported + sign * usd).max(0.0),
            (None, Some(price)) => {
                cost.computed = (cost.computed + sign * price.cost(usage)).max(0.0);
            }
            (None, None) if usage.total_tokens > 0 => {
                cost.unpriced_calls = if sign > 0.0 {
                    cost.unpriced_calls.saturating_add(1)
                } else {
                    cost.unpriced_calls.saturating_sub(1)
                };
            }
            (None, None) => {}
        }
        cost.usd = cost.reported + cost.computed;
    }

    /// Counts a call of host tool `name` (an MCP server's, when `mcp`).
    pub fn count_call(&mut self, name: &str, mcp: bool, calls: u64) {
        let map = if mcp {
            &mut self.mcp_calls
        } else {
            &mut self.host_calls
        };
        count_into(map, name, calls);
    }

    /// Adds a cell's processor seconds, and keeps the higher peak of memory.
    pub fn add_resources(&mut self, cpu_seconds: Option<f64>, peak_memory: Option<u64>) {
        if let Some(seconds) = cpu_seconds.filter(|s| s.is_finite() && *s >= 0.0) {
            self.cpu_seconds = Some(self.cpu_seconds.unwrap_or(0.0) + seconds);
        }
        if let Some(peak) = peak_memory {
            self.peak_memory = Some(self.peak_memory.map_or(peak, |p| p.max(peak)));
        }
    }

    /// Adds a connection through the egress proxy: let through or refused, and its bytes.
    pub fn add_connection(&mut self, allowed: bool, sent: u64, received: u64) {
        let e = &mut self.egress;
        if allowed {
            e.connections = e.connections.saturating_add(1);
        } else {
            e.refused = e.refused.saturating_add(1);
        }
        e.sent = e.sent.saturating_add(sent);
        e.received = e.received.saturating_add(received);
    }

    /// The ledger in one line for people: `1280 tokens, $0.0031, 1 cell, 0.35 s CPU, …`.
    pub fn summary(&self) -> String {
        self.summary_parts().join(", ")
    }

    /// The figures [`summary`](Self::summary) joins, each a short phrase.
    pub fn summary_parts(&self) -> Vec<String> {
        let mut parts = vec![format!("{} tokens", self.tokens.total_tokens)];
        if self.tokens.cached_tokens > 0 {
            parts.push(format!("{} cached", self.tokens.cached_tokens));
        }
        if self.tokens.reasoning_tokens > 0 {
            parts.push(format!("{} reasoning", self.tokens.reasoning_tokens));
        }
        if self.cost.usd > 0.0 || self.cost.unpriced_calls == 0 && self.model_calls > 0 {
            let how = match (self.cost.reported > 0.0, self.cost.computed > 0.0) {
                (true, false) => " reported",
                (false, true) => " computed",
                _ => "",
            };
            parts.push(format!("${}{how}", format_usd(self.cost.usd)));
        }
        parts.push(format!(
            "{} cell{}",
            self.cells,
            if self.cells == 1 { "" } else { "s" }
        ));
        if let Some(cpu) = self.cpu_seconds {
            parts.push(format!("{cpu:.2} s CPU"));
        }
        if let Some(peak) = self.peak_memory {
            parts.push(format!("{} peak", crate::format_size(peak)));
        }
        let calls = self.total_calls();
        if calls > 0 {
            parts.push(format!(
                "{calls} host call{}",
                if calls == 1 { "" } else { "s" }
            ));
        }
        if self.egress.connections + self.egress.refused > 0 {
            parts.push(format!(
                "{} in, {} out",
                crate::format_size(self.egress.received),
                crate::format_size(self.egress.sent)
            ));
        }
        parts
    }
}

/// Dollars with enough digits to show small sums: `0.0031`, `12.50`.
pub fn format_usd(usd: f64) -> String {
    if usd >= 1.0 || usd == 0.0 {
        format!("{usd:.2}")
    } else {
        // Four significant digits of a small sum.
        let digits = (-usd.log10()).ceil().clamp(0.0, 12.0) as usize + 3;
        let text = format!("{usd:.digits$}");
        let trimmed = text.trim_end_matches('0');
        // At least cents: `0.50`, not `0.5`.
        let cents = "0.00".len();
        if trimmed.len() < cents {
            format!("{usd:.2}")
        } else {
            trimmed.to_owned()
        }
    }
}

/// Counts a cell's host calls as they are made and refuses those past the session's budget.
/// The agent hands one to the runtime through its output sink (`OutputSink::host_calls`);
/// every runtime asks it before each host call (cave-cell's `run_host_call`).
#[derive(Debug, Default)]
pub struct HostCallMeter {
    /// Calls by name: host functions' and methods' first, MCP tools' second (looked up by
    /// `&str`: a call of a name already counted allocates nothing).
    calls: Mutex<[BTreeMap<String, u64>; 2]>,
    made: AtomicU64,
    refused: AtomicU64,
    /// The most calls this cell may make, and the session budget that says so.
    allowance: Option<(u64, u64)>,
}

impl HostCallMeter {
    /// A meter that counts and refuses nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A meter that refuses calls past `allowed`, what is left of a budget of `budget` calls.
    pub fn with_allowance(allowed: u64, budget: u64) -> Self {
        Self {
            allowance: Some((allowed, budget)),
            ..Self::default()
        }
    }

    /// A call of `name` (an MCP server's tool when `mcp`) is about to be made: counts it, or
    /// refuses it with the error the cell's code gets when the budget is spent.
    pub fn admit(&self, name: &str, mcp: bool) -> Result<(), HostError> {
        if let Some((allowed, budget)) = self.allowance {
            // Counted only when admitted: the budget says how many were made.
            let admitted = self
                .made
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |made| {
                    (made < allowed).then_some(made + 1)
                });
            if admitted.is_err() {
                self.refused.fetch_add(1, Ordering::AcqRel);
                return Err(HostError::new(
                    "PermissionError",
                    format!(
                        "the session's budget of {budget} host calls is spent: {name} was not called"
                    ),
                ));
            }
        } else {
            self.made.fetch_add(1, Ordering::AcqRel);
        }
        count_into(&mut crate::lock(&self.calls)[usize::from(mcp)], name, 1);
        Ok(())
    }

    /// Calls admitted so far.
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::Acquire)
    }

    /// Calls refused so far (past the budget).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Acquire)
    }

    /// The calls counted, by tool: `(mcp, name, calls)`, emptying the meter's list.
    pub fn take(&self) -> Vec<(bool, String, u64)> {
        let [host, mcp] = std::mem::take(&mut *crate::lock(&self.calls));
        host.into_iter()
            .map(|(name, n)| (false, name, n))
            .chain(mcp.into_iter().map(|(name, n)| (true, name, n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_price_charges_cached_tokens_at_their_rate() {
        let usage = Usage::new(1_000_000, 500_000).with_cached(400_000);
        let price = Price::per_million(2.0, 8.0).unwrap();
        assert!((price.cost(&usage) - (2.0 + 4.0)).abs() < 1e-9);
        let cached = price.with_cached_input(0.5).unwrap();
        assert!((cached.cost(&usage) - (0.6 * 2.0 + 0.4 * 0.5 + 4.0)).abs() < 1e-9);
        assert!(Price::per_million(-1.0, 1.0).is_none());
        assert!(Price::per_million(f64::NAN, 1.0).is_none());
    }

    #[test]
    fn reported_cost_wins_over_the_price_and_unpriced_calls_are_counted() {
        let price = Price::per_million(1.0, 1.0).unwrap();
        let mut ledger = Ledger::new();
        ledger.charge_call(Usage::new(1000, 1000), Some(0.5), Some(&price));
        ledger.charge_call(Usage::new(1000, 1000), None, Some(&price));
        assert_eq!(ledger.cost.reported, 0.5);
        assert!((ledger.cost.computed - 0.002).abs() < 1e-12);
        assert!((ledger.cost.usd - 0.502).abs() < 1e-12);
        ledger.charge_call(Usage::new(10, 10), None, None);
        assert_eq!(ledger.cost.unpriced_calls, 1);
        ledger.uncharge_call(Usage::new(10, 10), None, None);
        assert_eq!(ledger.cost.unpriced_calls, 0);
        assert_eq!(ledger.tokens.total_tokens, 4000);
    }

    #[test]
    fn the_meter_refuses_past_its_allowance_and_counts_what_it_let_through() {
        let meter = HostCallMeter::with_allowance(2, 5);
        assert!(meter.admit("add", false).is_ok());
        assert!(meter.admit("time.now", true).is_ok());
        let refused = meter.admit("add", false).unwrap_err();
        assert_eq!(refused.python_type, "PermissionError");
        assert!(
            refused.message.contains("budget of 5 host calls"),
            "{}",
            refused.message
        );
        assert_eq!((meter.made(), meter.refused()), (2, 1));
        let mut taken = meter.take();
        taken.sort();
        assert_eq!(
            taken,
            [(false, "add".into(), 1), (true, "time.now".into(), 1)]
        );
    }

    #[test]
    fn tools_past_the_most_a_ledger_names_are_counted_together() {
        let mut ledger = Ledger::new();
        for i in 0..MAX_LEDGER_TOOLS + 5 {
            ledger.count_call(&format!("f{i}"), false, 1);
        }
        assert_eq!(ledger.host_calls.len(), MAX_LEDGER_TOOLS + 1);
        assert_eq!(ledger.host_calls[OTHER_TOOLS], 5);
        assert_eq!(ledger.total_calls(), MAX_LEDGER_TOOLS as u64 + 5);
        // A name a cell made up is kept short, in the ledger and in the meter alike.
        let long = format!("obj.{}", "x".repeat(1 << 20));
        let mut ledger = Ledger::new();
        ledger.count_call(&long, true, 1);
        let meter = HostCallMeter::new();
        meter.admit(&long, true).unwrap();
        let (_, name, _) = &meter.take()[0];
        assert_eq!(name.chars().count(), MAX_TOOL_NAME);
        assert_eq!(ledger.mcp_calls.keys().next(), Some(name));
    }

    #[test]
    fn dollars_are_shown_with_their_significant_digits() {
        assert_eq!(format_usd(0.0), "0.00");
        assert_eq!(format_usd(12.5), "12.50");
        assert_eq!(format_usd(0.003125), "0.003125");
        assert_eq!(format_usd(0.5), "0.50");
        assert_eq!(format_usd(0.25), "0.25");
    }

    #[test]
    fn an_old_or_partial_ledger_reads_with_defaults() {
        let ledger: Ledger = serde_json::from_str(r#"{"cells": 3}"#).unwrap();
        assert_eq!(ledger.cells, 3);
        assert_eq!(ledger.cpu_seconds, None);
        let round: Ledger = serde_json::from_str(&serde_json::to_string(&ledger).unwrap()).unwrap();
        assert_eq!(round, ledger);
    }
}
