//! Usage and limits: what a run spent, and whether a budget or the run time is used up.

use super::*;

impl Run<'_> {
    pub(super) fn time_exceeded(&self) -> bool {
        self.agent
            .config
            .max_run_time
            .is_some_and(|limit| self.started.elapsed() >= limit)
    }

    pub(super) fn budget_crossed(&self) -> bool {
        self.budget_error().is_some()
    }

    /// The first token budget that is spent, if any.
    pub(super) fn budget_error(&self) -> Option<StopError> {
        let c = &self.agent.config;
        let u = &self.usage;
        [
            (
                c.max_total_tokens,
                u.total_tokens,
                StopErrorKind::MaxTotalTokens,
                "total",
            ),
            (
                c.max_input_tokens,
                u.prompt_tokens,
                StopErrorKind::MaxInputTokens,
                "input",
            ),
            (
                c.max_output_tokens,
                u.completion_tokens,
                StopErrorKind::MaxOutputTokens,
                "output",
            ),
        ]
        .into_iter()
        .find_map(|(cap, spent, kind, what)| {
            let cap = cap.filter(|cap| spent >= *cap)?;
            Some(StopError::new(
                kind,
                format!("the {what} token budget of {cap} is spent ({spent} used)"),
            ))
        })
        .or_else(|| self.session_budget_error())
    }

    /// The first of the session's budgets (money, processor time, host calls) that is spent,
    /// if any: they count the whole [`Ledger`](crate::Ledger), earlier runs included.
    pub(super) fn session_budget_error(&self) -> Option<StopError> {
        let c = &self.agent.config;
        let l = &self.agent.ledger;
        if let Some(cap) = c.max_cost.filter(|cap| l.cost.usd >= *cap) {
            return Some(StopError::new(
                StopErrorKind::MaxCost,
                format!(
                    "the cost budget of ${} is spent (${} used)",
                    crate::format_usd(cap),
                    crate::format_usd(l.cost.usd)
                ),
            ));
        }
        let cpu = l.cpu_seconds.unwrap_or(0.0);
        if let Some(cap) = c.max_cpu_time.filter(|cap| cpu >= cap.as_secs_f64()) {
            return Some(StopError::new(
                StopErrorKind::MaxCpuTime,
                format!(
                    "the processor-time budget of {} s is spent ({cpu:.2} s used)",
                    cap.as_secs_f64()
                ),
            ));
        }
        // Spent once a call past it was refused: the model may still answer after its last
        // allowed call.
        let calls = l.total_calls();
        if let Some(cap) = c
            .max_host_calls
            .filter(|cap| l.refused_host_calls > 0 && calls >= *cap)
        {
            return Some(StopError::new(
                StopErrorKind::MaxHostCalls,
                format!(
                    "the budget of {cap} host calls is spent ({calls} made, {} refused)",
                    l.refused_host_calls
                ),
            ));
        }
        None
    }

    /// Adds the call's usage to the run (estimated, and marked so, when the provider reported
    /// none) and anchors token estimates to the provider's prompt count. A call that failed
    /// before the model produced anything (refused connection, 401, 404) charges nothing.
    /// Returns what the call was charged.
    pub(super) fn settle_usage(&mut self, turn: &Turn) -> Usage {
        let produced =
            !turn.received.is_empty() || !turn.thinking.is_empty() || !turn.refusal.is_empty();
        let usage = match turn.reported_usage {
            Some(reported) if reported.total_tokens != 0 => reported,
            _ if !produced => return Usage::default(),
            _ => {
                let estimator = self.agent.estimator.as_ref();
                let completion = estimator.estimate(&turn.received)
                    + estimator.estimate(&turn.refusal)
                    + estimator.estimate(&turn.thinking);
                Usage::new(turn.prompt_estimate, completion.max(1)).estimate()
            }
        };
        self.usage += usage;
        let price = self.agent.config.price;
        self.agent
            .ledger
            .charge_call(usage, turn.reported_cost, price.as_ref());
        if usage.prompt_tokens > 0 {
            self.agent.anchor = Some(TokenAnchor::new(
                &self.agent.history,
                usage.prompt_tokens,
                self.agent.estimator.as_ref(),
            ));
        }
        usage
    }

    /// The usage an answer stopped at its block reported after it (read while the code ran),
    /// in place of the estimate `charged` when the call was settled (on top of `before`, the
    /// run's usage until then): the run's total, the step's figure, the ledger and the token
    /// anchor (on the `sent` messages) follow it; so does a cost reported there.
    pub(super) async fn settle_tail(
        &mut self,
        turn: &mut Turn,
        before: Usage,
        charged: &mut Usage,
        sent: usize,
    ) {
        let Some(tail) = turn.tail.take() else {
            return;
        };
        let Ok(tail) = tail.await else {
            return;
        };
        let reported = tail.usage.filter(|_| charged.estimated);
        let cost = tail.cost.or(turn.reported_cost);
        if reported.is_none() && cost == turn.reported_cost {
            return;
        }
        let price = self.agent.config.price;
        let ledger = &mut self.agent.ledger;
        ledger.uncharge_call(*charged, turn.reported_cost, price.as_ref());
        let now = reported.unwrap_or(*charged);
        ledger.charge_call(now, cost, price.as_ref());
        ledger.tokens.estimated = turn.ledger_estimated_before || now.estimated;
        turn.reported_cost = cost;
        let Some(reported) = reported else {
            return;
        };
        self.usage = before + reported;
        *charged = reported;
        if reported.prompt_tokens > 0 {
            let sent = &self.agent.history[..sent.min(self.agent.history.len())];
            self.agent.anchor = Some(TokenAnchor::new(
                sent,
                reported.prompt_tokens,
                self.agent.estimator.as_ref(),
            ));
        }
    }
}
