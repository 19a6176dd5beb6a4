"""Outputs (MQTT, webhooks, WebRTC): later issues. Imports pipelines.types only."""
