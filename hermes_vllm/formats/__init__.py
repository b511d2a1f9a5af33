"""Hermes ChatML formats: prompt rendering, chat templates, tool-call formatting, conversions."""
