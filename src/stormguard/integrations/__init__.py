"""Adapters between stormguard and other libraries; they translate, the policies decide."""
