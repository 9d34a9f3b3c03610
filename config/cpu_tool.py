# Multiplication with a calculator (tools.py): 3-digit x 2-digit, the tool shown in one chat turn.
#   python data/multiply/prepare.py
#   python train.py config/cpu_tool.py
# The same problems without the tool (lab.py's tool_use study):
#   python data/multiply/prepare.py --tool=0 --out_dir=data/multiply_notool
#   python train.py config/cpu_tool.py --tool='' --data_dir=data/multiply_notool
exec(open('config/cpu_demo.py').read())
out_dir = 'out/cpu_tool'
data_dir = 'data/multiply'
reward_fn = 'multiply'        # the model's own text graded, the tool's blocks removed
tool = 'calc'
max_tool_calls = 2
max_new_tokens = 48           # the model's tokens and the tool's results together
eval_problems = 50            # x 4 samples, twice (with the tool, and with its calls unanswered)
