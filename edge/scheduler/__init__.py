"""edge.scheduler"""
