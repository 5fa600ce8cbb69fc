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
    /// run's usage until then): the run's total, the step's figure and the token anchor (on the
    /// `sent` messages) follow it.
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
        let Ok(Some(reported)) = tail.await else {
            return;
        };
        if !charged.estimated {
            return;
        }
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
