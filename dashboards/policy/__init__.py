"""The idle-GPU policy's actions and its command (`gpufleet policy`): mail, webhook, scancel and
pod deletion, carried out on the plans of gpufleet.analytics.policy, where its rules live.

Beside the weekly report (dashboards/report/), whose mail settings and sender it uses; installed
as gpufleet.policy."""
