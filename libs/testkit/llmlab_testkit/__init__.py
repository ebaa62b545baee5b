"""Test support: real processes, real NATS, one namespace per test so runs never collide."""
