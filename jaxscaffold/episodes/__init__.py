"""Episodes: an agent and a batch of environments, stepped together to the end.

`driver.run_episodes` is the one loop (reset, act, step, feedback, observe); the agents
(`agents`: the model on the sampler, the scripted gold and explorer policies) decide the
actions; `representations` are the two ways the model's token rows are built (one growing
trajectory, or a prompt rebuilt each step); `episode.Episode` is what comes back.
"""
